//! Where an execution is, and the Klavis word for it.

/// Where an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecState {
    Uploaded,
    Queued,
    Installing,
    Running,
    Completed,
    Failed,
}

impl ExecState {
    /// Klavis's status word.
    pub fn klavis(self) -> &'static str {
        match self {
            ExecState::Uploaded | ExecState::Queued => "pending",
            ExecState::Installing | ExecState::Running => "running",
            ExecState::Completed => "completed",
            ExecState::Failed => "failed",
        }
    }

    pub fn active(self) -> bool {
        matches!(
            self,
            ExecState::Queued | ExecState::Installing | ExecState::Running
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klavis_sees_four_statuses() {
        use ExecState::*;
        let k: Vec<_> = [Uploaded, Queued, Installing, Running, Completed, Failed]
            .map(ExecState::klavis)
            .to_vec();
        assert_eq!(
            k,
            [
                "pending",
                "pending",
                "running",
                "running",
                "completed",
                "failed"
            ]
        );
    }
}
