//! The fleet against a real kube-apiserver (`real`): the shipped
//! manifests applied as an operator would, the fleet authenticated as the
//! shipped ServiceAccount with only the shipped Role, agent-sandbox's
//! controllers played by the test. What the HTTP stand-in of
//! `tests/fleet.rs` accepts, the real server must accept too.

// Shared with the host's tests (tests/host/kube_real.rs): not every
// helper is used here.
#[allow(dead_code)]
mod real;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use real::{RealApi, controller};
use sandbox_kube::crd::{Sandbox, SandboxClaim};
use sandbox_kube::lease::{self, Lease, Phase};
use sandbox_kube::{Fleet, FleetConfig, KubeError};
use serde_json::Value;

const POOL: &str = "sandbox-default";
const OWNER: &str = "tenant-a";

fn fleet_of(client: kube::Client, ns: &str) -> Fleet {
    Fleet::new(
        client,
        FleetConfig {
            namespace: ns.to_owned(),
            pools: BTreeMap::from([("default".to_owned(), POOL.to_owned())]),
            claim_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(90),
            coord: Default::default(),
        },
    )
}

fn lease(id: &str, pool: &str) -> Lease {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    Lease {
        sandbox_id: id.to_owned(),
        owner: OWNER.to_owned(),
        pool: pool.to_owned(),
        phase: Phase::Acquiring,
        benchmark: None,
        servers: Value::Null,
        created_at: "2026-01-01T00:00:05Z".to_owned(),
        updated_at: "2026-01-01T00:00:05Z".to_owned(),
        expires_at_ms: Some(now_ms + 3_600_000),
        claim: String::new(),
        pod_ip: None,
        host: None,
    }
}

/// The test process's API server (`real::shared_api`): each test takes a
/// namespace of its own.
async fn shared() -> &'static RealApi {
    tokio::task::spawn_blocking(|| &real::shared_api().1)
        .await
        .expect("the API server")
}

/// Waits until `ns` holds no claim and no sandbox.
async fn nothing_left(api: &RealApi, ns: &str) {
    let claims: Api<SandboxClaim> = Api::namespaced(api.admin.clone(), ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(api.admin.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = claims.list(&ListParams::default()).await.expect("claims");
        let s = sandboxes
            .list(&ListParams::default())
            .await
            .expect("sandboxes");
        if c.items.is_empty() && s.items.is_empty() {
            return;
        }
        let names = |v: Vec<Option<String>>| v.into_iter().flatten().collect::<Vec<_>>();
        assert!(
            Instant::now() < deadline,
            "left: claims {:?}, sandboxes {:?}",
            names(c.items.into_iter().map(|c| c.metadata.name).collect()),
            names(s.items.into_iter().map(|s| s.metadata.name).collect()),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A whole lease through the fleet as the shipped Role allows it: the
/// claim made (the server validates it: it needs its `apiVersion` and
/// `kind`), waited for until its sandbox is Ready, read back by id and
/// by owner, recorded, released (the finalizer off, the claim gone, its
/// sandbox collected). A claim of a missing pool fails and is deleted.
/// The Role grants nothing beyond: the host's token cannot read Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_a_real_api_server_as_the_shipped_role() {
    const NS: &str = "lease";
    let api = shared().await;
    let host = api.install(NS).await;
    let _controller = controller::spawn(api.admin.clone(), NS, "127.0.0.1");
    let fleet = fleet_of(host.clone(), NS);

    let id = "0b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d";
    let mut l = lease(id, POOL);
    let claimed = fleet
        .claim(&l, 8)
        .await
        .unwrap_or_else(|e| panic!("the claim: {e}\n{}", api.logs()));
    assert_eq!(claimed.claim, format!("sbx-{id}"));
    assert_eq!(claimed.ip, "127.0.0.1");

    let found = fleet.find(id).await.expect("find").expect("the lease");
    assert_eq!((found.owner.as_str(), found.pool.as_str()), (OWNER, POOL));
    let mine = fleet.leases(Some(OWNER)).await.expect("leases");
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert!(
        fleet
            .leases(Some("tenant-b"))
            .await
            .expect("leases")
            .is_empty()
    );

    l.claim = claimed.claim.clone();
    l.phase = Phase::Occupied;
    l.pod_ip = Some(claimed.ip.clone());
    let written = l.clone();
    let updated = fleet.update(id, move |x| *x = written.clone()).await;
    assert_eq!(updated.expect("update"), Some(l.clone()));
    let found = fleet.find(id).await.expect("find").expect("the lease");
    assert_eq!(found.phase, Phase::Occupied);

    // Two replicas writing the same lease at once lose no write: each
    // update is a read-modify-write at the version it read.
    let n = |l: &Lease| l.servers["n"].as_u64().unwrap_or(0);
    let writers = (0..2).map(|_| {
        // Another replica's fleet over the same API server.
        let f = fleet_of(host.clone(), NS);
        tokio::spawn(async move {
            let mut done = 0;
            for _ in 0..10 {
                let bump = |l: &mut Lease| l.servers = serde_json::json!({"n": n(l) + 1});
                match f.update(id, bump).await {
                    Ok(Some(_)) => done += 1,
                    Ok(None) => panic!("the claim went"),
                    Err(e) => assert!(e.to_string().contains("409"), "{e}"),
                }
            }
            done
        })
    });
    let mut done = 0;
    for w in writers.collect::<Vec<_>>() {
        done += w.await.expect("writer");
    }
    let found = fleet.find(id).await.expect("find").expect("the lease");
    assert_eq!(n(&found), done, "updates written vs counted");
    assert!(done >= 10, "{done} of 20 updates written");

    let claims: Api<SandboxClaim> = Api::namespaced(api.admin.clone(), NS);
    let c = claims.get(&claimed.claim).await.expect("the claim");
    assert_eq!(
        c.metadata.finalizers.as_deref(),
        Some(&[lease::FINALIZER.to_owned()][..])
    );
    fleet.release(&claimed.claim).await.expect("release");
    nothing_left(api, NS).await;

    // A pool the cluster does not have: the claim fails and is deleted.
    let other = "1b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d";
    match fleet.claim(&lease(other, "no-such-pool"), 8).await {
        Err(KubeError::ClaimFailed { reason, .. }) => {
            assert!(reason.contains("WarmPoolNotFound"), "{reason}")
        }
        other => panic!("a claim of a missing pool: {other:?}"),
    }
    nothing_left(api, NS).await;

    // The shipped Role is all the host has.
    let secrets: Api<Secret> = Api::namespaced(host, NS);
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the host listed Secrets: {other:?}"),
    }
}

/// A claim whose sandbox is not Ready within the claim timeout (a pool
/// with no pod to hand over, or a pod that never gets Ready) is
/// `PoolEmpty` and deleted, nothing left; the wait watches the claim and
/// its sandbox (the audit log holds their watches and no read of either
/// by name: nothing is read on a timer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_a_ready_sandbox_is_pool_empty_and_deleted() {
    const NS: &str = "empty";
    let api = shared().await;
    let host = api.install(NS).await;
    let mut cfg = fleet_of(host.clone(), NS).config().clone();
    cfg.claim_timeout = Duration::from_secs(3);
    let fleet = Fleet::new(host, cfg);

    let cases = [
        (
            "no pod to hand over",
            "3b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d",
        ),
        ("a pod never Ready", "4b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d"),
    ];
    for (case, id) in cases {
        let _controller = if case == "no pod to hand over" {
            controller::spawn_pods(api.admin.clone(), NS, &[])
        } else {
            controller::spawn_pending(api.admin.clone(), NS)
        };
        let from = api.audit().len();
        let started = Instant::now();
        match fleet.claim(&lease(id, POOL), 8).await {
            Err(KubeError::PoolEmpty { pool, claim, .. }) => {
                assert_eq!(
                    (pool.as_str(), claim),
                    (POOL, format!("sbx-{id}")),
                    "{case}"
                )
            }
            other => panic!("{case}: {other:?}"),
        }
        // It waited its claim timeout (3 s), and ended: the create, the
        // watches and the deletion around that wait are the API server's
        // round trips, whose time is the machine's (11 s once on a slow
        // hour with the whole suite beside), so the bound only says that
        // nothing hangs. How fast it is, is the kube bench's to say.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited < Duration::from_secs(60),
            "{case}: {waited:?}"
        );
        nothing_left(api, NS).await;

        let claim = format!("sbx-{id}");
        let calls: Vec<(String, String, String)> = api.audit()[from..]
            .iter()
            .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "ResponseStarted")
            .filter(|e| {
                e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.contains("sandbox-host"))
            })
            .map(|e| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (
                    s(&e["verb"]),
                    s(&e["objectRef"]["resource"]),
                    s(&e["objectRef"]["name"]),
                )
            })
            .collect();
        let watched = |resource: &str| calls.iter().any(|(v, r, _)| v == "watch" && r == resource);
        assert!(watched("sandboxclaims"), "{case}: {calls:?}");
        if case == "a pod never Ready" {
            assert!(watched("sandboxes"), "{case}: {calls:?}");
        }
        // The claim read by name only by the release (its finalizer
        // taken off at the version read); the sandbox never.
        let gets = |resource: &str| {
            calls
                .iter()
                .filter(|(v, r, n)| {
                    v == "get" && r == resource && (n == &claim || resource == "sandboxes")
                })
                .count()
        };
        assert!(gets("sandboxclaims") <= 1, "{case}: {calls:?}");
        assert_eq!(gets("sandboxes"), 0, "{case}: {calls:?}");
    }
}

/// Claims as hosts, admins and the controller leave them, read and
/// released by the fleet on the real server (its own namespace, no
/// controller but the test): a claim deleted by an admin under a live
/// lease (terminating, held by the hosts' finalizer) and one whose pod
/// failed read as `error`; one waiting for its pod as `acquiring`; an
/// annotation that is no lease is an error of that claim alone, skipped
/// in lists; a list of more claims than a page is read page by page;
/// releasing a claim already gone, or one left without our finalizer, is
/// done; another controller's finalizer stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_left_as_they_are_read_and_released_on_the_real_server() {
    const ADMIN_NS: &str = "claims";
    let api = shared().await;
    let host = api.install(ADMIN_NS).await;
    let mut cfg = fleet_of(host.clone(), ADMIN_NS).config().clone();
    cfg.namespace = ADMIN_NS.to_owned();
    let fleet = Fleet::new(host, cfg);
    let claims: Api<SandboxClaim> = Api::namespaced(api.admin.clone(), ADMIN_NS);
    let pp = kube::api::PatchParams::default();
    let make = |l: Lease, status: Value, finalizers: Vec<&'static str>| {
        let claims = claims.clone();
        let pp = pp.clone();
        async move {
            let name = format!("sbx-{}", l.sandbox_id);
            let c: SandboxClaim = serde_json::from_value(serde_json::json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                "metadata": {"name": name, "labels": l.labels(),
                             "annotations": {lease::RECORD: l.record()}, "finalizers": finalizers},
                "spec": {"warmPoolRef": {"name": POOL}},
            }))
            .expect("claim");
            claims
                .create(&Default::default(), &c)
                .await
                .expect("create");
            if !status.is_null() {
                let st = serde_json::json!({ "status": status });
                claims
                    .patch_status(&name, &pp, &kube::api::Patch::Merge(&st))
                    .await
                    .expect("status");
            }
            name
        }
    };
    let cond = |status: &str, reason: &str| {
        serde_json::json!([{"type": "Ready", "status": status, "reason": reason,
            "message": reason, "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    };
    let occupied = |id: &str| {
        let mut l = lease(id, POOL);
        l.phase = Phase::Occupied;
        l.pod_ip = Some("10.244.1.17".into());
        l
    };
    let ours = vec![lease::FINALIZER];
    let ready = serde_json::json!({"conditions": cond("True", "DependenciesReady"),
        "sandbox": {"name": "pool-1", "podIPs": ["10.244.1.17"]}});

    let deleted = make(
        occupied("d0000000-0000-4000-8000-000000000000"),
        ready.clone(),
        ours.clone(),
    )
    .await;
    claims
        .delete(&deleted, &Default::default())
        .await
        .expect("kubectl delete");
    let failed = serde_json::json!({"conditions": cond("False", "PodFailed"), "sandbox": {"name": "pool-2"}});
    make(
        occupied("e0000000-0000-4000-8000-000000000000"),
        failed,
        ours.clone(),
    )
    .await;
    make(
        occupied("f0000000-0000-4000-8000-000000000000"),
        ready.clone(),
        ours.clone(),
    )
    .await;
    let waiting = serde_json::json!({"conditions": cond("False", "DependenciesNotReady"), "sandbox": {"name": "pool-3"}});
    make(
        lease("a0000000-0000-4000-8000-000000000000", POOL),
        waiting,
        ours.clone(),
    )
    .await;
    let mut bad = occupied("c0000000-0000-4000-8000-000000000000");
    bad.owner = "someone-else".into();
    let bad_name = make(bad, Value::Null, vec![]).await;
    let garbage = serde_json::json!({"metadata": {"annotations": {lease::RECORD: "{not json"}}});
    claims
        .patch(&bad_name, &pp, &kube::api::Patch::Merge(&garbage))
        .await
        .expect("annotation");

    let phase = |l: Option<Lease>| l.expect("a lease").phase;
    let find = |id: &'static str| fleet.find(id);
    assert_eq!(
        phase(
            find("d0000000-0000-4000-8000-000000000000")
                .await
                .expect("find")
        ),
        Phase::Error
    );
    assert_eq!(
        phase(
            find("e0000000-0000-4000-8000-000000000000")
                .await
                .expect("find")
        ),
        Phase::Error
    );
    assert_eq!(
        phase(
            find("f0000000-0000-4000-8000-000000000000")
                .await
                .expect("find")
        ),
        Phase::Occupied
    );
    assert_eq!(
        phase(
            find("a0000000-0000-4000-8000-000000000000")
                .await
                .expect("find")
        ),
        Phase::Acquiring
    );
    assert!(
        find("b0000000-0000-4000-8000-000000000000")
            .await
            .expect("find")
            .is_none()
    );
    match find("c0000000-0000-4000-8000-000000000000").await {
        Err(KubeError::BadRecord { claim, .. }) => assert_eq!(claim, bad_name),
        other => panic!("an annotation that is no lease: {other:?}"),
    }
    let mut phases: Vec<(String, Phase)> = fleet
        .leases(None)
        .await
        .expect("leases")
        .into_iter()
        .map(|l| (l.claim, l.phase))
        .collect();
    phases.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        phases,
        [
            (
                "sbx-a0000000-0000-4000-8000-000000000000".to_owned(),
                Phase::Acquiring
            ),
            (
                "sbx-d0000000-0000-4000-8000-000000000000".to_owned(),
                Phase::Error
            ),
            (
                "sbx-e0000000-0000-4000-8000-000000000000".to_owned(),
                Phase::Error
            ),
            (
                "sbx-f0000000-0000-4000-8000-000000000000".to_owned(),
                Phase::Occupied
            ),
        ]
    );

    // Released: gone already; without our finalizer; with another's.
    fleet
        .release("sbx-b0000000-0000-4000-8000-000000000000")
        .await
        .expect("gone already");
    fleet
        .release(&bad_name)
        .await
        .expect("no finalizer of ours");
    assert!(claims.get_opt(&bad_name).await.expect("get").is_none());
    let kept = make(
        occupied("f1000000-0000-4000-8000-000000000000"),
        Value::Null,
        vec!["example.com/backup", lease::FINALIZER],
    )
    .await;
    fleet.release(&kept).await.expect("release");
    let c = claims
        .get(&kept)
        .await
        .expect("held by the other finalizer");
    assert!(c.metadata.deletion_timestamp.is_some());
    assert_eq!(
        c.metadata.finalizers.as_deref(),
        Some(&["example.com/backup".to_owned()][..])
    );

    // More claims than a page: read page by page (limit and continue).
    let n = sandbox_kube::fleet::LIST_PAGE as usize + 1;
    let made = (0..n).map(|i| {
        let mut l = lease(&format!("00000000-0000-4000-9000-{i:012}"), POOL);
        l.owner = "many".into();
        make(l, Value::Null, vec![])
    });
    futures_util::future::join_all(made).await;
    let many = fleet.leases(Some("many")).await.expect("leases");
    assert_eq!(many.len(), n);
}

/// With every host gone, a lease's claim still ends at its
/// `shutdownTime`: the controller deletes the claim in the foreground
/// (`DeleteForeground`), so the garbage collector deletes its sandbox
/// while the host's finalizer holds the claim (terminating, the lease
/// readable as `error` by a host that comes back), and the claim goes
/// when a host releases it. With `Delete` the sandbox would stay until
/// then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_gone_past_shutdown_time_ends_the_sandbox() {
    const NS: &str = "shutdown";
    let api = shared().await;
    let host = api.install(NS).await;
    let _controller = controller::spawn(api.admin.clone(), NS, "127.0.0.1");
    let mut cfg = fleet_of(host.clone(), NS).config().clone();
    cfg.shutdown_grace = Duration::ZERO;
    let fleet = Fleet::new(host, cfg);

    let id = "2b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d";
    let mut l = lease(id, POOL);
    // Expires in 4 s; no host reaps it (none runs).
    l.expires_at_ms = l.expires_at_ms.map(|ms| ms - 3_600_000 + 4_000);
    let claimed = fleet
        .claim(&l, 8)
        .await
        .unwrap_or_else(|e| panic!("the claim: {e}\n{}", api.logs()));
    l.claim = claimed.claim.clone();
    l.phase = Phase::Occupied;
    let written = l.clone();
    let updated = fleet.update(id, move |x| *x = written.clone()).await;
    assert_eq!(updated.expect("update"), Some(l.clone()));
    let claims: Api<SandboxClaim> = Api::namespaced(api.admin.clone(), NS);
    let sandboxes: Api<Sandbox> = Api::namespaced(api.admin.clone(), NS);
    assert!(
        sandboxes
            .get_opt(&claimed.sandbox)
            .await
            .expect("get")
            .is_some()
    );

    let deadline = Instant::now() + Duration::from_secs(40);
    while sandboxes
        .get_opt(&claimed.sandbox)
        .await
        .expect("get")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the sandbox outlived its claim's shutdownTime by 36 s: {:?}",
            claims
                .get_opt(&claimed.claim)
                .await
                .ok()
                .flatten()
                .map(|c| c.metadata)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let c = claims
        .get_opt(&claimed.claim)
        .await
        .expect("get")
        .expect("the claim, held by the host's finalizer");
    assert!(c.metadata.deletion_timestamp.is_some(), "{:?}", c.metadata);
    let found = fleet.find(id).await.expect("find").expect("the lease");
    assert_eq!(found.phase, Phase::Error, "{found:?}");

    fleet.release(&claimed.claim).await.expect("release");
    nothing_left(api, NS).await;
}

/// Replicas coordinate through Leases on the real server, as the shipped
/// Role allows. An owner's cap across two replicas is decided before any
/// claim: of two Acquires racing with a cap of 1, exactly one is
/// admitted, and the other is refused with no claim made and no warm
/// sandbox adopted (5 rounds). A claim left acquiring by a replica whose
/// presence lapsed (killed mid-Acquire) stops counting once it is older
/// than a presence's lifetime; one of a replica present counts. One replica at a time holds the reaper's Lease, and
/// another takes it over when it is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_coordinate_the_cap_orphans_and_the_reaper() {
    const NS: &str = "replicas";
    use k8s_openapi::api::coordination::v1::Lease as KLease;
    use sandbox_kube::coord::{self, Lock};

    let api = shared().await;
    let host = api.install(NS).await;
    let controller = controller::spawn(api.admin.clone(), NS, "127.0.0.1");
    let (a, b) = (fleet_of(host.clone(), NS), fleet_of(host.clone(), NS));
    let present_a = a.announce("replica-a").await.expect("presence of a");
    let present_b = b.announce("replica-b").await.expect("presence of b");
    // As a host does: no claim before its presence is held.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(present_a.held() && present_b.held()) {
        assert!(Instant::now() < deadline, "the presences were not taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Made now, as a host makes them.
    let on = |id: &str, replica: &str| {
        let mut l = lease(id, POOL);
        l.host = Some(replica.to_owned());
        l.created_at = k8s_openapi::jiff::Timestamp::now().to_string();
        l
    };

    for round in 0..5usize {
        let (ia, ib) = (
            format!("3b7c6f6e-3f1c-4c55-9d0e-{round:012}"),
            format!("4b7c6f6e-3f1c-4c55-9d0e-{round:012}"),
        );
        let (la, lb) = (on(&ia, "replica-a"), on(&ib, "replica-b"));
        let (ra, rb) = tokio::join!(a.claim(&la, 1), b.claim(&lb, 1));
        let (won, lost) = match (ra, rb) {
            (Ok(c), Err(e)) | (Err(e), Ok(c)) => (c, e),
            other => panic!("round {round}: not exactly one admitted: {other:?}"),
        };
        assert!(
            matches!(lost, KubeError::OwnerFull { held: 1, limit: 1 }),
            "{lost:?}"
        );
        assert_eq!(
            controller.adopted(),
            round + 1,
            "a warm sandbox was spent on a refused Acquire"
        );
        a.release(&won.claim).await.expect("release");
        nothing_left(api, NS).await;
    }

    // A replica killed mid-Acquire: its presence lapsed long ago, its
    // claim is still acquiring.
    let leases: Api<KLease> = Api::namespaced(api.admin.clone(), NS);
    let lapsed: KLease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{}replica-gone", coord::PRESENCE_PREFIX)},
        "spec": {
            "holderIdentity": "replica-gone",
            "leaseDurationSeconds": 3,
            "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }))
    .expect("lease");
    leases
        .create(&Default::default(), &lapsed)
        .await
        .expect("the lapsed presence");
    // Made long ago (a young claim of a replica not seen counts: it may
    // be one that just started).
    let mut orphan = on("5b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d", "replica-gone");
    orphan.created_at = "2026-01-01T00:00:05Z".to_owned();
    let orphan = a.claim(&orphan, 1).await.expect("the orphan's claim");
    let live = b.live_replicas().await.expect("replicas");
    assert!(
        live.contains("replica-a") && live.contains("replica-b"),
        "{live:?}"
    );
    assert!(!live.contains("replica-gone"), "{live:?}");
    let next = b
        .claim(&on("6b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d", "replica-b"), 1)
        .await
        .expect("admitted past the orphan");
    // That one is acquiring on replica-b, which is present: it counts.
    match a
        .claim(&on("7b7c6f6e-3f1c-4c55-9d0e-7d7a4a1b2c3d", "replica-a"), 1)
        .await
    {
        Err(KubeError::OwnerFull { held: 1, limit: 1 }) => {}
        other => panic!("past the cap: {other:?}"),
    }
    for c in [&orphan.claim, &next.claim] {
        a.release(c).await.expect("release");
    }
    nothing_left(api, NS).await;

    // The reaper's Lease: one holder, then the other once it is given up.
    let ttl = Duration::from_secs(3);
    let ra = Lock::take(host.clone(), NS, coord::REAPER, "replica-a", ttl)
        .await
        .expect("lock a");
    let rb = Lock::take(host.clone(), NS, coord::REAPER, "replica-b", ttl)
        .await
        .expect("lock b");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(ra.held() || rb.held()) {
        assert!(
            Instant::now() < deadline,
            "no replica took the reaper's Lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!(ra.held() && rb.held()), "two reapers");
    let (holder, other) = if ra.held() { (ra, rb) } else { (rb, ra) };
    holder.release(Duration::from_secs(5)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !other.held() {
        assert!(
            Instant::now() < deadline,
            "the other replica did not take the reaper's Lease over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
