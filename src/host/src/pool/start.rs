//! How a new slot is started: its directory, its backend's process (an
//! agent, isolated or not, or a VM), then the wait until its agent serves.
//! A slot whose process exits before it serves is started afresh, up to
//! [`START_TRIES`] times in all.

use tracing::{info, warn};

use super::backend::{Backend, agent_args, spawn_in_session, spawn_isolated};
use super::{Pool, PoolError, Slot};

/// How many times a new slot is started before its start fails, when its
/// process exited before it served. Bubblewrap has been seen to fail its
/// netlink setup of a slot's loopback once in a while when slots start
/// together (`Failed RTM_NEWADDR`), after it had reported the agent's pid:
/// the next start works. A slot that is merely slow is not started again:
/// it had its whole `--slot-start-timeout`.
pub(super) const START_TRIES: usize = 2;

impl Pool {
    /// Starts a slot and waits until its agent serves (see the module).
    pub(super) async fn spawn(&self) -> Result<Slot, PoolError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.spawn_once().await {
                Err(e @ PoolError::NotServing { exited: true, .. }) if tries < START_TRIES => {
                    warn!(error = %e, tries, "a new sandbox exited before it served; starting another");
                }
                Err(PoolError::NotServing {
                    backend,
                    why,
                    log,
                    exited,
                }) if tries > 1 => {
                    return Err(PoolError::NotServing {
                        backend,
                        why: format!("{why}; started {tries} times"),
                        log,
                        exited,
                    });
                }
                r => return r,
            }
        }
    }

    async fn spawn_once(&self) -> Result<Slot, PoolError> {
        if self.is_closed() || matches!(self.cfg.backend, Backend::Kubernetes) {
            // The kubernetes backend's sandboxes are claimed pods
            // (`crate::fleet::cluster`), never made here.
            return Err(PoolError::Stopping);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        // Not an orphan for the reclaim while it is in no list yet.
        let _making = self.reclaim.making(&id);
        let dir = self.cfg.dir.join(&id);
        std::fs::create_dir_all(&dir)
            .map_err(PoolError::io(format!("creating {}", dir.display())))?;
        let kind = self.cfg.backend.kind();
        std::fs::write(dir.join("backend"), kind.name())
            .map_err(PoolError::io(format!("writing {}/backend", dir.display())))?;
        let pid = self.launch(&dir, &id).await?;
        std::fs::write(dir.join("agent.pid"), pid.to_string()).map_err(PoolError::io(format!(
            "writing {}/agent.pid",
            dir.display()
        )))?;
        let slot = Slot::local(id, kind, dir, pid);
        {
            let mut starting = self.starting();
            if self.is_closed() {
                drop(starting);
                self.reclaim.discard_off_runtime(slot).await;
                return Err(PoolError::Stopping);
            }
            starting.insert(slot.id.clone(), slot.clone());
        }
        // From here until it leaves `starting`, a close stops it; after
        // that the caller places it (idle or leased) without awaiting.
        let ready = self.wait_serving(&slot).await;
        if ready.is_ok() {
            self.learn_catalog(&slot).await;
            self.give_catalogs(&slot).await;
        }
        let still_ours = self.starting().remove(&slot.id).is_some();
        ready?;
        if !still_ours {
            return Err(PoolError::Stopping);
        }
        info!(slot = %slot.id, pid, backend = kind.name(), "sandbox started");
        Ok(slot)
    }

    /// Starts the slot's main process in `dir` by its backend, logging to
    /// `dir/agent.log`; returns its pid. An isolated setup that fails is
    /// undone, its directory removed.
    async fn launch(&self, dir: &std::path::Path, id: &str) -> Result<u32, PoolError> {
        let log = std::fs::File::create(dir.join("agent.log")).map_err(PoolError::io(format!(
            "creating {}/agent.log",
            dir.display()
        )))?;
        match &self.cfg.backend {
            Backend::Kubernetes => Err(PoolError::Stopping),
            Backend::Process {
                agent_bin,
                manifest,
            } => match &self.cfg.isolation {
                Some(iso) => {
                    let (iso, d, i) = (iso.clone(), dir.to_owned(), id.to_owned());
                    let (agent_bin, manifest) = (agent_bin.clone(), manifest.clone());
                    let env = self.cfg.agent_env.clone();
                    let started = tokio::task::spawn_blocking(move || {
                        spawn_isolated(&iso, &d, &i, &agent_bin, manifest.as_deref(), &env, log)
                    })
                    .await
                    .map_err(|e| PoolError::io("the task starting a sandbox")(e.into()));
                    match started {
                        Ok(Ok(pid)) => Ok(pid),
                        Ok(Err(e)) | Err(e) => {
                            let (r, d) = (self.reclaim.clone(), dir.to_owned());
                            let _ = tokio::task::spawn_blocking(move || r.remove_dir(&d)).await;
                            Err(e)
                        }
                    }
                }
                None => {
                    let a = agent_args(dir, id, agent_bin, manifest.as_deref(), false)?;
                    let mut cmd = std::process::Command::new(&a[0]);
                    self.cfg.agent_env.apply(&mut cmd);
                    cmd.args(&a[1..]).env("SANDBOX_AGENT_CONFIG", "/dev/null");
                    spawn_in_session(cmd, log)
                }
            },
            Backend::Qemu {
                run_script,
                image,
                memory_mib,
                cpus,
                accel,
            } => {
                let mut c = std::process::Command::new(run_script);
                self.cfg.agent_env.apply(&mut c);
                c.arg("--initramfs")
                    .arg(image)
                    .arg("--vsock-uds")
                    .arg(dir.join("vsock.sock"))
                    .arg("--memory")
                    .arg(memory_mib.to_string())
                    .env("SANDBOX_AGENT_ACCEL", accel);
                if let Some(n) = cpus {
                    c.arg("--cpus").arg(n.to_string());
                }
                spawn_in_session(c, log)
            }
        }
    }
}
