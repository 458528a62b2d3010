//! A POST's answer as an SSE stream: what the child sends for the POST's
//! requests while they run, then their answers.

use std::collections::VecDeque;

use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use super::super::router::Out;

/// A streamed POST answer: the child's messages for its requests as they
/// come, then the answers (sent on the channel by the work's task, or
/// `tail` when the work had ended before the stream began).
pub(super) struct St {
    queue: VecDeque<String>,
    rx: mpsc::Receiver<Out>,
    tail: Vec<String>,
    done: bool,
    _task: Option<AbortOnDropHandle<()>>,
}

impl St {
    pub(super) fn new(
        queue: VecDeque<String>,
        rx: mpsc::Receiver<Out>,
        tail: Vec<String>,
        task: Option<AbortOnDropHandle<()>>,
    ) -> St {
        St {
            queue,
            rx,
            tail,
            done: false,
            _task: task,
        }
    }

    pub(super) async fn next(mut self) -> Option<(String, St)> {
        loop {
            if let Some(m) = self.queue.pop_front() {
                return Some((m, self));
            }
            if self.done {
                return None;
            }
            match self.rx.recv().await {
                Some(Out::Message(m)) => self.queue.push_back(m.to_string()),
                Some(Out::Done(answers)) => {
                    self.done = true;
                    self.queue.extend(answers);
                }
                None => {
                    self.done = true;
                    self.queue.extend(std::mem::take(&mut self.tail));
                }
            }
        }
    }
}
