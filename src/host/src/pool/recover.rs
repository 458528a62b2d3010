//! A restarted host takes back the slots its predecessor left running.

use sandbox_client::proto;

use super::{Idle, Kind, Pool, Slot};

impl Pool {
    /// After a host restart: slots still running are taken back (leased
    /// when a live sandbox names them, idle otherwise, after releasing any
    /// lease they hold); the rest are removed. Returns the slots that are
    /// gone.
    pub async fn recover(&self, in_use: &[String]) -> Vec<String> {
        let mut gone = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.cfg.dir) else {
            return gone;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let id2 = id.clone();
            let dir = e.path();
            let kind = match std::fs::read_to_string(dir.join("backend")).as_deref() {
                Ok("qemu") => Kind::Qemu,
                _ => Kind::Process,
            };
            let pid = std::fs::read_to_string(dir.join("agent.pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok());
            let slot = pid.map(|pid| Slot::local(id.clone(), kind, dir.clone(), pid));
            // A slot taken back holds its id block for this host now.
            if let (Some(iso), Some(s)) = (&self.cfg.isolation, &slot)
                && s.alive()
            {
                iso.adopt_block(&dir);
            }
            match slot {
                Some(s) if s.alive() && in_use.contains(&id) => {
                    self.leased().insert(id, s);
                }
                Some(s)
                    if s.alive()
                        && s.kind == self.cfg.backend.kind()
                        && self.idle().len() < self.cfg.size =>
                {
                    // An agent nobody leases may still hold a warm lease, or
                    // the lease of a sandbox released while the host was
                    // down.
                    if let Ok(c) = s.client(self.cfg.deadlines.release).await {
                        let _ = c.agent().release(proto::ReleaseRequest::default()).await;
                    }
                    if let Err(s) = self.put_idle(Idle::bare(s)) {
                        self.reclaim.discard_off_runtime(s).await;
                        gone.push(id);
                    }
                }
                other => {
                    let r = self.reclaim.clone();
                    let removed = tokio::task::spawn_blocking(move || match other {
                        Some(s) => r.discard(&s),
                        None => {
                            super::isolate::teardown(&id2, &dir);
                            r.remove_dir(&dir);
                        }
                    });
                    let _ = removed.await;
                    gone.push(id);
                }
            }
        }
        gone
    }
}
