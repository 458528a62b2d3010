//! The hybrid-vsock client against a peer that speaks the VMM side of the
//! protocol (`CONNECT <port>\n` → `OK <n>\n`, then bytes to the guest), the
//! way Firecracker and vhost-device-vsock do. After OK the peer forwards to a
//! real agent, so the whole gRPC path is exercised.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use sandbox_client::transport::hvsock::{self, AttemptError, HvsockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

#[derive(Clone, Copy)]
enum Behaviour {
    /// Answer OK at once.
    Ok,
    /// Read CONNECT, then never answer.
    Silent,
    /// Close the first n connections after CONNECT (guest not listening yet).
    DropFirst(usize),
    /// Answer OK after a delay.
    DelayOk(Duration),
    /// Answer something that is not OK.
    Garbage,
}

struct Peer {
    path: PathBuf,
    connects: Arc<AtomicUsize>,
    ports: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Peer {
    fn start(path: &Path, guest: Option<PathBuf>, behaviour: Behaviour) -> Peer {
        let listener = UnixListener::bind(path).unwrap();
        let connects = Arc::new(AtomicUsize::new(0));
        let ports = Arc::new(Mutex::new(Vec::new()));
        let (c, p) = (connects.clone(), ports.clone());
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let n = c.fetch_add(1, Ordering::SeqCst);
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                    continue;
                }
                p.lock().unwrap().push(line.clone());
                let mut stream = reader.into_inner();
                let answer_ok = match behaviour {
                    Behaviour::Ok => true,
                    Behaviour::Silent => {
                        held.push(stream);
                        continue;
                    }
                    Behaviour::DropFirst(k) => n >= k,
                    Behaviour::DelayOk(d) => {
                        tokio::time::sleep(d).await;
                        true
                    }
                    Behaviour::Garbage => {
                        let _ = stream.write_all(b"HELLO THERE\n").await;
                        continue;
                    }
                };
                if !answer_ok {
                    drop(stream);
                    continue;
                }
                stream.write_all(b"OK 1073741824\n").await.unwrap();
                let guest = guest.clone().expect("guest socket");
                tokio::spawn(async move {
                    let mut upstream = UnixStream::connect(guest).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
                });
            }
        });
        Peer {
            path: path.to_owned(),
            connects,
            ports,
            task,
        }
    }

    fn uri(&self, port: u32) -> String {
        format!("hvsock://{}:{port}", self.path.display())
    }
}

async fn ctl_async(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ctl(&refs)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_handshake_reaches_the_agent() {
    let agent = Agent::start(&[]);
    let peer = Peer::start(
        &agent.dir.path().join("vm.sock"),
        Some(agent.socket.clone()),
        Behaviour::Ok,
    );

    let out = ctl_async(vec!["--agent".into(), peer.uri(1024), "health".into()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "SERVING");
    let out = ctl_async(vec![
        "--agent".into(),
        peer.uri(1024),
        "info".into(),
        "--json".into(),
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(peer.ports.lock().unwrap()[0], "CONNECT 1024\n");

    // The library client over the same path.
    let client = sandbox_client::connect(&peer.uri(1024))
        .await
        .expect("connect");
    let info = client
        .agent()
        .get_info(sandbox_client::proto::GetInfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.agent_pid, agent.child.id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_times_out_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Peer::start(&dir.path().join("vm.sock"), None, Behaviour::Silent);
    let opts = HvsockOptions {
        handshake_timeout: Duration::from_millis(300),
        retry_deadline: Duration::from_millis(1000),
        ..HvsockOptions::default()
    };
    let start = Instant::now();
    let err = hvsock::connect(&peer.path, 1024, &opts)
        .await
        .expect_err("silent peer");
    let took = start.elapsed();
    assert!(matches!(err.last, AttemptError::Timeout(_)), "{err}");
    assert!(err.attempts >= 2, "retried: {err}");
    assert!(
        took < Duration::from_secs(3),
        "deadline respected: {took:?}"
    );
    assert!(err.to_string().contains("no OK within"), "{err}");

    let out = ctl_async(vec![
        "--agent".into(),
        peer.uri(1024),
        "--timeout".into(),
        "1".into(),
        "health".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(e.contains("no OK within") && e.contains("hvsock://"), "{e}");

    // The retry deadline is the bound, even past the per-attempt connect
    // timeout: the error read is the handshake's, not tonic's bare
    // "deadline has elapsed" (which won the race under CI's load once).
    let opts = sandbox_client::ConnectOptions {
        connect_timeout: Duration::from_millis(200),
        hvsock: HvsockOptions {
            handshake_timeout: Duration::from_millis(300),
            retry_deadline: Duration::from_millis(1200),
            ..HvsockOptions::default()
        },
        ..sandbox_client::ConnectOptions::default()
    };
    let err = match opts.connect(&peer.uri(1024)).await {
        Ok(_) => panic!("a silent peer connected"),
        Err(e) => sandbox_client::error_chain(&e),
    };
    assert!(err.contains("no OK within"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booting_guest_late_ok_is_retried() {
    let agent = Agent::start(&[]);
    let peer = Peer::start(
        &agent.dir.path().join("vm.sock"),
        Some(agent.socket.clone()),
        Behaviour::DropFirst(3),
    );
    let out = ctl_async(vec!["--agent".into(), peer.uri(1024), "health".into()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        peer.connects.load(Ordering::SeqCst),
        4,
        "three dropped CONNECTs, then OK"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_ok_within_the_handshake_timeout_is_accepted() {
    let agent = Agent::start(&[]);
    let peer = Peer::start(
        &agent.dir.path().join("vm.sock"),
        Some(agent.socket.clone()),
        Behaviour::DelayOk(Duration::from_millis(700)),
    );
    let stream = hvsock::connect(&peer.path, 1024, &HvsockOptions::default())
        .await
        .expect("late OK");
    drop(stream);
    assert_eq!(peer.connects.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmm_socket_appearing_late_is_retried() {
    let agent = Agent::start(&[]);
    let path = agent.dir.path().join("vm.sock");
    let guest = agent.socket.clone();
    let p = path.clone();
    let starter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Peer::start(&p, Some(guest), Behaviour::Ok)
    });
    let client = sandbox_client::connect(&format!("hvsock://{}:1024", path.display())).await;
    let peer = starter.await.unwrap();
    assert!(client.is_ok(), "{:?}", client.err());
    assert_eq!(peer.connects.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_is_not_ok_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Peer::start(&dir.path().join("vm.sock"), None, Behaviour::Garbage);
    let opts = HvsockOptions {
        retry_deadline: Duration::from_millis(300),
        ..HvsockOptions::default()
    };
    let err = hvsock::connect(&peer.path, 7, &opts)
        .await
        .expect_err("garbage");
    assert!(
        matches!(&err.last, AttemptError::BadReply(r) if r == "HELLO THERE"),
        "{err}"
    );
}

/// vhost-device-vsock 0.3.0 panics its vring thread (and the VM's vsock is
/// dead from then on) when its `OK` meets a socket the client already
/// closed. So a client that stops waiting must leave the socket open until
/// the VMM has answered: here every answer comes after the per-attempt
/// timeout, and every one must still be written to an open socket, which the
/// client then closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_meets_an_open_socket_after_the_client_gave_up() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("vm.sock")).unwrap();
    let answers: Arc<Mutex<Vec<Result<bool, String>>>> = Arc::default();
    let a = answers.clone();
    let vmm = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let a = a.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                let _ = reader.read_line(&mut line).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut stream = reader.into_inner();
                let answer = match stream.write_all(b"OK 1073741824\n").await {
                    // Then the client, who no longer wants the stream, closes it.
                    Ok(()) => {
                        let mut rest = Vec::new();
                        let read = tokio::time::timeout(
                            Duration::from_secs(5),
                            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut rest),
                        )
                        .await;
                        Ok(matches!(read, Ok(Ok(0))))
                    }
                    Err(e) => Err(e.to_string()),
                };
                a.lock().unwrap().push(answer);
            });
        }
    });
    let opts = HvsockOptions {
        handshake_timeout: Duration::from_millis(150),
        retry_deadline: Duration::from_millis(600),
        ..HvsockOptions::default()
    };
    let err = hvsock::connect(&dir.path().join("vm.sock"), 1024, &opts)
        .await
        .expect_err("every answer comes after the per-attempt timeout");
    assert!(matches!(err.last, AttemptError::Timeout(_)), "{err}");
    assert!(err.attempts >= 2, "{err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while answers.lock().unwrap().len() < err.attempts as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    vmm.abort();
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers.len(), err.attempts as usize, "{answers:?}");
    assert!(
        answers.iter().all(|a| a == &Ok(true)),
        "each OK reached an open socket, closed afterwards: {answers:?}"
    );
}
