//! The restart policy, as a pure function of what happened: whether a
//! server whose process ended comes back, after how long, or gives up as a
//! crash loop. The runner feeds it exits and sleeps what it says.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::manifest::{Restart, RestartPolicy};

/// What to do after a server's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Leave it down: `failed` unless it ended cleanly.
    Stay { failed: bool },
    /// Too many restarts within the window: leave it failed.
    GiveUp { restarts: usize, window: Duration },
    /// Start it again after `after`.
    Restart { after: Duration },
}

/// One server's restart history under its policy.
#[derive(Debug)]
pub struct RestartTracker {
    policy: Restart,
    /// When each restart within the window happened.
    recent: VecDeque<Instant>,
    /// The delay of the next restart.
    backoff: Duration,
}

impl RestartTracker {
    pub fn new(policy: Restart) -> RestartTracker {
        RestartTracker {
            backoff: policy.initial_backoff,
            policy,
            recent: VecDeque::new(),
        }
    }

    /// The process ended at `now` after running for `ran`; `clean` means it
    /// exited 0 after becoming ready. A run longer than the window resets
    /// the backoff; restarts older than the window are forgotten; each
    /// restart doubles the backoff up to its maximum.
    pub fn decide(&mut self, clean: bool, ran: Duration, now: Instant) -> Decision {
        let wanted = match self.policy.policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => !clean,
            RestartPolicy::Never => false,
        };
        if ran > self.policy.window {
            self.backoff = self.policy.initial_backoff;
        }
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.policy.window)
        {
            self.recent.pop_front();
        }
        if !wanted {
            return Decision::Stay { failed: !clean };
        }
        if self.recent.len() as u32 >= self.policy.max_restarts {
            return Decision::GiveUp {
                restarts: self.recent.len(),
                window: self.policy.window,
            };
        }
        self.recent.push_back(now);
        let after = self.backoff;
        self.backoff = (self.backoff * 2).min(self.policy.max_backoff);
        Decision::Restart { after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn tracker(policy: RestartPolicy, max_restarts: u32) -> RestartTracker {
        RestartTracker::new(Restart {
            policy,
            initial_backoff: 100 * MS,
            max_backoff: 350 * MS,
            max_restarts,
            window: 10_000 * MS,
        })
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum_then_a_crash_loop_gives_up() {
        let mut t = tracker(RestartPolicy::OnFailure, 4);
        let t0 = Instant::now();
        let afters: Vec<Decision> = (0..5)
            .map(|i| t.decide(false, MS, t0 + i * 10 * MS))
            .collect();
        assert_eq!(
            afters,
            [
                Decision::Restart { after: 100 * MS },
                Decision::Restart { after: 200 * MS },
                Decision::Restart { after: 350 * MS },
                Decision::Restart { after: 350 * MS },
                Decision::GiveUp {
                    restarts: 4,
                    window: 10_000 * MS
                },
            ]
        );
    }

    #[test]
    fn restarts_older_than_the_window_are_forgotten_and_a_long_run_resets_the_backoff() {
        let mut t = tracker(RestartPolicy::Always, 2);
        let t0 = Instant::now();
        assert_eq!(
            t.decide(true, MS, t0),
            Decision::Restart { after: 100 * MS }
        );
        assert_eq!(
            t.decide(true, MS, t0 + MS),
            Decision::Restart { after: 200 * MS }
        );
        // Past the window: both restarts are forgotten, and the process ran
        // longer than the window, so the backoff starts over.
        let later = t0 + 20_000 * MS;
        assert_eq!(
            t.decide(true, 15_000 * MS, later),
            Decision::Restart { after: 100 * MS }
        );
    }

    #[test]
    fn policies_decide_who_comes_back() {
        let now = Instant::now();
        assert_eq!(
            tracker(RestartPolicy::OnFailure, 5).decide(true, MS, now),
            Decision::Stay { failed: false }
        );
        assert_eq!(
            tracker(RestartPolicy::Never, 5).decide(false, MS, now),
            Decision::Stay { failed: true }
        );
        assert_eq!(
            tracker(RestartPolicy::Never, 5).decide(true, MS, now),
            Decision::Stay { failed: false }
        );
        assert!(matches!(
            tracker(RestartPolicy::Always, 5).decide(true, MS, now),
            Decision::Restart { .. }
        ));
        assert!(matches!(
            tracker(RestartPolicy::OnFailure, 0).decide(false, MS, now),
            Decision::GiveUp { restarts: 0, .. }
        ));
    }
}
