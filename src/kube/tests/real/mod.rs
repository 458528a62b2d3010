//! A real Kubernetes API server for the fleet's tests: kube-apiserver
//! v1.36.2 (`../shared/tools`, its README says how it was built) over
//! Debian's etcd, on loopback, with certificates made here by openssl. As
//! an operator would, the tests apply agent-sandbox's CRDs
//! (`../shared/kubernetes`) and `packaging/kubernetes/` into a namespace,
//! then talk to the server as the shipped ServiceAccount, bound to the
//! shipped Role and nothing more. Nothing else of a cluster runs:
//! [`controller`] plays agent-sandbox's controllers.

pub mod controller;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use serde_json::Value;

/// The repository's root.
fn root() -> PathBuf {
    // This crate's tests (src/kube) and the host's (the root package)
    // both include this module.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("packaging/kubernetes").is_dir())
        .unwrap_or(here)
        .to_path_buf()
}

/// `rel` of the shared directory beside the checkout (else /work/shared).
fn shared(rel: &str) -> PathBuf {
    let beside = root().join("../shared").join(rel);
    if beside.exists() {
        beside
    } else {
        Path::new("/work/shared").join(rel)
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// kube-apiserver, decompressed once into target/ and checked against the
/// decompressed binary's sum in SHA256SUMS.
fn apiserver_binary() -> PathBuf {
    let tools = shared("tools");
    let xz = tools.join("kube-apiserver-v1.36.2.xz");
    assert!(
        xz.exists(),
        "{}: missing (the real API server these tests need; ../shared/tools beside the checkout)",
        xz.display()
    );
    let bin = root().join("target/kube-apiserver-v1.36.2");
    // The tests of this binary start at once: one decompresses, the
    // others wait for it (another test binary renames its own copy in).
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    if !bin.exists() {
        let tmp = bin.with_extension(format!("tmp{}", std::process::id()));
        let out = std::fs::File::create(&tmp).expect("target/");
        run(Command::new("xz").arg("-dc").arg(&xz).stdout(out));
        let sums = std::fs::read_to_string(tools.join("SHA256SUMS")).expect("SHA256SUMS");
        let want = sums
            .lines()
            .find(|l| l.contains("kube-apiserver (decompressed)"))
            .and_then(|l| l.split_whitespace().next())
            .expect("the decompressed binary's sum");
        let got = Command::new("sha256sum")
            .arg(&tmp)
            .output()
            .expect("sha256sum");
        let got = String::from_utf8_lossy(&got.stdout);
        assert!(
            got.starts_with(want),
            "{}: sum {got}, want {want}",
            tmp.display()
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&tmp, &bin).expect("rename");
    }
    bin
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A CA, the server's certificate for 127.0.0.1, an admin's client
/// certificate (group system:masters) and the service-account key pair.
fn certificates(d: &Path) {
    let ssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(d));
    ssl(&["genrsa", "-out", "ca.key", "2048"]);
    ssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=test-ca",
        "-days",
        "2",
        "-out",
        "ca.crt",
    ]);
    // X.509 v3 both (rustls refuses v1): the server's for 127.0.0.1.
    let server = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n";
    std::fs::write(d.join("apiserver.ext"), server).expect("ext");
    std::fs::write(d.join("admin.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    for (name, subj) in [
        ("apiserver", "/CN=kube-apiserver"),
        ("admin", "/O=system:masters/CN=admin"),
    ] {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        ssl(&["genrsa", "-out", &key, "2048"]);
        ssl(&["req", "-new", "-key", &key, "-subj", subj, "-out", &csr]);
        ssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ]);
    }
    ssl(&["genrsa", "-out", "sa.key", "2048"]);
    ssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
}

/// A kubeconfig for `url` with `user` (YAML of client-certificate paths or
/// a token).
fn kubeconfig(d: &Path, url: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: c\n  context:\n    cluster: test\n    user: u\n    namespace: default\ncurrent-context: c\n",
        d.join("ca.crt").display()
    )
}

fn spawn_apiserver(command: &[String], d: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("apiserver.log"))
        .expect("log");
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).stdout(Stdio::null()).stderr(log);
    spawn_kept(cmd).expect("kube-apiserver")
}

/// Starts `cmd` so that it dies with this test process, however the
/// process ends (a server shared by a whole test binary is never
/// dropped): it is spawned with `PR_SET_PDEATHSIG` from a thread that
/// lives as long as the process (the signal follows the spawning thread).
fn spawn_kept(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static KEEPER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    // SAFETY: prctl is async-signal-safe; nothing else runs in the child
    // between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for (mut cmd, back) in rx {
                let _ = back.send(cmd.spawn());
            }
        });
        std::sync::Mutex::new(tx)
    });
    let (back, answer) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, back))
        .map_err(|_| std::io::Error::other("the keeper thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the keeper thread is gone"))?
}

/// One API server for a whole test process, with an audit log, started at
/// its first use and never restarted: each test installs a namespace of
/// its own ([`RealApi::install`]) and plays its controllers there. Its
/// runtime runs what the tests spawn (controllers) and their clients.
pub fn shared_api() -> &'static (tokio::runtime::Runtime, RealApi) {
    static SHARED: std::sync::OnceLock<(tokio::runtime::Runtime, RealApi)> =
        std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let api = rt.block_on(RealApi::start_with(true));
        (rt, api)
    })
}

/// A client whose requests run on the runtime that made it, whichever
/// runtime awaits them. Each `#[tokio::test]` has a runtime of its own,
/// and the shared server's admin client is used by all of them: a request
/// run where it is awaited dials its connection with that test's I/O
/// driver, and the pooled connection then fails every later user with "A
/// Tokio 1.x context was found, but it is being shutdown" once that test
/// ends (seen in CI as `SendRequest` errors).
pub async fn client_of(path: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::client::ClientBuilder::try_from(cfg)
        .expect("client")
        .with_layer(&OnRuntime(tokio::runtime::Handle::current()))
        .build()
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs each request of the service it wraps as a task of one runtime.
#[derive(Clone)]
struct OnRuntime(tokio::runtime::Handle);

impl<S> tower::Layer<S> for OnRuntime {
    type Service = Pinned<S>;
    fn layer(&self, inner: S) -> Pinned<S> {
        Pinned {
            inner,
            runtime: self.0.clone(),
        }
    }
}

struct Pinned<S> {
    inner: S,
    runtime: tokio::runtime::Handle,
}

impl<S, R> tower::Service<R> for Pinned<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let task = self.runtime.spawn(self.inner.call(request));
        Box::pin(async move { task.await.map_err(BoxError::from)?.map_err(Into::into) })
    }
}

/// The server, its store, and an admin's client.
pub struct RealApi {
    dir: tempfile::TempDir,
    /// etcd, then kube-apiserver.
    children: Vec<Child>,
    /// kube-apiserver's command line, to start it again.
    apiserver: Vec<String>,
    pub url: String,
    pub admin: kube::Client,
}

impl Drop for RealApi {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl RealApi {
    /// etcd and kube-apiserver on free loopback ports; ready (`/readyz`)
    /// with agent-sandbox's CRDs established.
    pub async fn start() -> RealApi {
        RealApi::start_with(false).await
    }

    /// [`RealApi::start`], with an audit log of every request's metadata
    /// when `audit` ([`RealApi::audit`]).
    pub async fn start_with(audit: bool) -> RealApi {
        let bin = apiserver_binary();
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        certificates(d);
        let (pe, pp, pa) = (free_port(), free_port(), free_port());
        let log = |n: &str| std::fs::File::create(d.join(n)).expect("log");
        let mut etcd = Command::new("etcd");
        etcd.args(["--data-dir", &d.join("etcd").display().to_string()])
            .args(["--name", "test"])
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{pe}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{pe}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{pp}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{pp}"),
            ])
            .args(["--initial-cluster", &format!("test=http://127.0.0.1:{pp}")])
            .stdout(Stdio::null())
            .stderr(log("etcd.log"));
        let etcd = spawn_kept(etcd).expect("etcd (Debian's etcd-server)");
        let p = |n: &str| d.join(n).display().to_string();
        let mut command = vec![bin.display().to_string()];
        command.extend([
            format!("--etcd-servers=http://127.0.0.1:{pe}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={pa}"),
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/24".to_owned(),
            "--profiling=false".to_owned(),
        ]);
        if audit {
            std::fs::write(
                d.join("audit-policy.yaml"),
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n",
            )
            .expect("audit policy");
            command.extend([
                format!("--audit-policy-file={}", p("audit-policy.yaml")),
                format!("--audit-log-path={}", p("audit.log")),
            ]);
        }
        let apiserver = spawn_apiserver(&command, d);
        let url = format!("https://127.0.0.1:{pa}");
        let admin_user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            p("admin.crt"),
            p("admin.key")
        );
        std::fs::write(d.join("admin.kubeconfig"), kubeconfig(d, &url, &admin_user))
            .expect("kubeconfig");
        let admin = client_of(&d.join("admin.kubeconfig")).await;
        let mut api = RealApi {
            dir,
            children: vec![etcd, apiserver],
            apiserver: command,
            url,
            admin,
        };
        api.wait_ready().await;
        api.apply_crds().await;
        api
    }

    /// Stops kube-apiserver (etcd keeps the state), as a restart does.
    pub fn stop_apiserver(&mut self) {
        if let Some(c) = self.children.get_mut(1) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts kube-apiserver again on the same port and store; ready.
    pub async fn start_apiserver(&mut self) {
        let c = spawn_apiserver(&self.apiserver, self.dir.path());
        // etcd stays first; the server's old child was waited for.
        self.children.truncate(1);
        self.children.push(c);
        self.wait_ready().await;
    }

    /// The kubeconfig of the shipped ServiceAccount that [`RealApi::install`]
    /// wrote for namespace `ns`.
    pub fn host_kubeconfig(&self, ns: &str) -> PathBuf {
        self.dir.path().join(format!("host-{ns}.kubeconfig"))
    }

    /// The audit log's events so far (with [`RealApi::start_with`]`(true)`).
    pub fn audit(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The server's logs, for failure messages.
    pub fn logs(&self) -> String {
        let tail = |n: &str| {
            let t = std::fs::read_to_string(self.dir.path().join(n)).unwrap_or_default();
            let from = t.len().saturating_sub(3000);
            t.get(from..).unwrap_or_default().to_owned()
        };
        format!(
            "etcd:\n{}\nkube-apiserver:\n{}",
            tail("etcd.log"),
            tail("apiserver.log")
        )
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("request");
            if let Ok(t) = self.admin.request_text(req).await
                && t.trim() == "ok"
            {
                return;
            }
            for c in &mut self.children {
                if let Ok(Some(s)) = c.try_wait() {
                    panic!("the API server or etcd ended ({s}):\n{}", self.logs());
                }
            }
            assert!(
                Instant::now() < deadline,
                "the API server not ready within 90 s:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// agent-sandbox's four CRDs, created and established.
    async fn apply_crds(&self) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.admin.clone());
        let dir = shared("kubernetes/agent-sandbox-crds");
        let mut names = Vec::new();
        for e in std::fs::read_dir(&dir).expect("agent-sandbox-crds") {
            let path = e.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("crd");
            let crd: CustomResourceDefinition =
                serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            names.push(crd.metadata.name.clone().unwrap_or_default());
            crds.create(&PostParams::default(), &crd)
                .await
                .unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
        }
        for name in names {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let c = crds.get(&name).await.expect("crd");
                let established = c.status.and_then(|s| s.conditions).is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
                if established {
                    break;
                }
                assert!(Instant::now() < deadline, "{name} not established");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// `ns` with every object of `packaging/kubernetes/`'s kustomization
    /// created in it as the admin (`kubectl apply -k … -n ns`), then a
    /// client of the shipped ServiceAccount (a token the API server made).
    pub async fn install(&self, ns: &str) -> kube::Client {
        let nss: Api<Namespace> = Api::all(self.admin.clone());
        let n: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": ns}
        }))
        .expect("namespace");
        nss.create(&PostParams::default(), &n)
            .await
            .expect("namespace");
        let pk = root().join("packaging/kubernetes");
        let mut account = None;
        for file in [
            "secrets.yaml",
            "sandbox-templates.yaml",
            "warm-pools.yaml",
            "host.yaml",
        ] {
            let text = std::fs::read_to_string(pk.join(file)).expect(file);
            for doc in serde_yaml_ng::Deserializer::from_str(&text) {
                let v = <Value as serde::Deserialize>::deserialize(doc).expect(file);
                if v.is_null() {
                    continue;
                }
                if v["kind"] == "ServiceAccount" {
                    account = v["metadata"]["name"].as_str().map(str::to_owned);
                }
                self.create(ns, file, v).await;
            }
        }
        let account = account.expect("host.yaml's ServiceAccount");
        let sas: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), ns);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = sas
            .create_token_request(&account, &PostParams::default(), &req)
            .await
            .expect("a token of the host's ServiceAccount")
            .status
            .expect("token status")
            .token;
        let d = self.dir.path();
        let path = d.join(format!("host-{ns}.kubeconfig"));
        let user = format!("    token: {token}\n");
        let text = kubeconfig(d, &self.url, &user)
            .replace("namespace: default", &format!("namespace: {ns}"));
        std::fs::write(&path, text).expect("kubeconfig");
        client_of(&path).await
    }

    /// Creates `v` (one object of `file`) in `ns`, its type found by
    /// discovery.
    async fn create(&self, ns: &str, file: &str, v: Value) {
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let (api_version, kind) = (text("apiVersion"), text("kind"));
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        let gvk = GroupVersionKind::gvk(group, version, &kind);
        let (ar, caps) = kube::discovery::pinned_kind(&self.admin, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{file}: {api_version} {kind}: {e}"));
        let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
            Api::namespaced_with(self.admin.clone(), ns, &ar)
        } else {
            Api::all_with(self.admin.clone(), &ar)
        };
        let obj: DynamicObject = serde_json::from_value(v).expect("object");
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{file}: creating {kind} {name}: {e}"));
    }
}
