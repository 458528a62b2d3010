//! Waiting for a claim's sandbox by watching it: the claim until it names
//! its sandbox, then that sandbox until it is Ready with a pod IP, the
//! claim still watched for a failure or a deletion. No object is read on
//! a timer; each watch is renewed every [`WATCH_SECONDS`].

use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::{CLAIMS, Claimed, Fleet, SANDBOXES, WATCH_SECONDS};
use crate::crd::SandboxClaim;
use crate::error::KubeError;
use crate::retry::{self, Call};

impl Fleet {
    /// Watches claim `name` until its sandbox is Ready with a pod IP or
    /// the claim fails or goes; the caller bounds the wait.
    pub(super) async fn wait_ready(&self, name: &str, pool: &str) -> Result<Claimed, KubeError> {
        let failed = |reason: String| KubeError::ClaimFailed {
            pool: pool.to_owned(),
            claim: name.to_owned(),
            reason,
        };
        let ns = &self.cfg.namespace;
        let sandbox = watch_until(&self.claims, name, CLAIMS, ns, bound)
            .await?
            .map_err(failed)?;
        let ready = watch_until(&self.sandboxes, &sandbox, SANDBOXES, ns, |s| {
            s.and_then(|s| s.ready_ip()).map(str::to_owned)
        });
        let lost = watch_until(&self.claims, name, CLAIMS, ns, |c| bound(c)?.err());
        tokio::select! {
            biased;
            ip = ready => Ok(Claimed { claim: name.to_owned(), sandbox, ip: ip? }),
            reason = lost => Err(failed(reason?)),
        }
    }
}

/// What a claim says of its sandbox: named (`Ok`), failed or gone (`Err`,
/// why), or nothing yet (`None`).
fn bound(c: Option<&SandboxClaim>) -> Option<Result<String, String>> {
    let Some(c) = c else {
        return Some(Err(
            "the claim was deleted while its sandbox was awaited".to_owned()
        ));
    };
    if let Some(reason) = c.failure() {
        return Some(Err(reason));
    }
    c.sandbox_name().map(|s| Ok(s.to_owned()))
}

/// Watches object `name` of `api` until `f` says something of it (`f`
/// sees `None` while the object does not exist). Transient errors are
/// tried again for [`retry::WINDOW`], as every other call's are; what
/// persists is reported as a failed `watch` of `resource`.
async fn watch_until<K, T>(
    api: &Api<K>,
    name: &str,
    resource: &'static str,
    namespace: &str,
    mut f: impl FnMut(Option<&K>) -> Option<T>,
) -> Result<T, KubeError>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let cfg = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(WATCH_SECONDS);
    let mut stream = std::pin::pin!(watcher::watcher(api.clone(), cfg));
    let mut failing_since: Option<Instant> = None;
    let mut pause = retry::FIRST_PAUSE;
    // Whether the object was in the list being read (a relist that does
    // not hold it means it is gone).
    let mut listed = false;
    while let Some(event) = stream.next().await {
        let seen = match event {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitApply(o)) => {
                listed = true;
                f(Some(&o))
            }
            Ok(Event::Apply(o)) => f(Some(&o)),
            Ok(Event::InitDone) if !listed => f(None),
            Ok(Event::InitDone) => None,
            Ok(Event::Delete(_)) => f(None),
            Err(watcher::Error::NoResourceVersion) => {
                return Err(KubeError::Watch {
                    resource,
                    name: name.to_owned(),
                    reason: "its answer carried no resourceVersion".to_owned(),
                });
            }
            Err(e) => {
                let Some(e) = api_error(e) else { continue };
                let since = *failing_since.get_or_insert_with(Instant::now);
                if !retry::transient(&e, Call::Repeatable) || since.elapsed() >= retry::WINDOW {
                    return Err(KubeError::api("watch", resource, namespace)(e));
                }
                tracing::info!(error = %e, "a transient error of the Kubernetes API server's watch; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        failing_since = None;
        pause = retry::FIRST_PAUSE;
        if let Some(t) = seen {
            return Ok(t);
        }
    }
    Err(KubeError::Watch {
        resource,
        name: name.to_owned(),
        reason: "the watch ended".to_owned(),
    })
}

/// The API error behind a watch's, or `None` for one the watcher mends
/// by itself (410 Gone: it lists again; no resourceVersion is handled
/// by the caller).
fn api_error(e: watcher::Error) -> Option<kube::Error> {
    match e {
        watcher::Error::WatchError(s) if s.code == 410 => None,
        watcher::Error::WatchError(s) => Some(kube::Error::Api(s)),
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => Some(e),
        watcher::Error::NoResourceVersion => None,
    }
}
