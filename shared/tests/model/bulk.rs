//! The operator's bulk operation in a history (issue 36): a replay or a discard of the pending
//! letters of one job id's tenant, started as the API starts it and worked by the operations
//! worker as the scheduled function runs it, its worker cut off mid-work (a SIGKILL: the
//! future dropped at an await) and the next one going on. Replays go out through the local SQS
//! API and come back into the history's queue, as any message does.

use super::World;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use shared::clock::Clock;
use shared::dead_letter::ListFilter;
use shared::ids::DeadLetterId;
use shared::operations::{self, Action, OperationTools, Request};
use shared::replay::Replayer;
use std::time::Duration;

impl World {
    async fn sqs(&self) -> (aws_sdk_sqs::Client, String) {
        let sqs = aws_sdk_sqs::Client::new(&aws_config::load_from_env().await);
        let mut create = sqs
            .create_queue()
            .queue_name(super::queue_name(self.cfg.fifo));
        if self.cfg.fifo {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        let url = create
            .send()
            .await
            .expect("CreateQueue")
            .queue_url
            .expect("a URL");
        (sqs, url)
    }

    /// A bulk `replay` (else discard) of the pending letters of job `slot`'s tenant; the first
    /// worker is cut off after `cut` polls, if given, and the next works it to its end.
    pub async fn bulk(&mut self, slot: u8, replay: bool, cut: Option<u8>) {
        let (sqs, url) = self.sqs().await;
        self.drain(&sqs, &url).await; // nothing of an earlier history
        let tenant = self.jobs[usize::from(slot) % self.jobs.len()].1;
        let selection = ListFilter {
            tenant_id: Some(tenant),
            ..ListFilter::default()
        };
        let action = if replay {
            Action::Replay
        } else {
            Action::Discard
        };
        // Time passes between the letters and the request (the operation takes letters
        // written before it).
        self.clock.advance(chrono::Duration::seconds(1));
        let request = Request {
            action,
            selection: &selection,
            reason: "model: the operator's bulk operation",
            actor: super::OPERATOR,
        };
        let op = operations::start(&self.pool, &request, self.clock.now())
            .await
            .expect("starting the operation");
        let tools = OperationTools {
            pool: self.pool.clone(),
            clock: self.clock.clone(),
            replayer: Some(Replayer::new(sqs.clone())),
        };
        let until = || tokio::time::Instant::now() + Duration::from_secs(30);
        let mut did = format!(
            "bulk {action} of slot {slot}'s tenant ({} planned)",
            op.planned
        );
        if let Some(cut) = cut {
            let first = operations::work(&tools, until(), 10);
            let finished = shared_testkit::cut_after_polls(first, u32::from(cut))
                .await
                .is_some();
            did += if finished {
                ", its worker finished"
            } else {
                ", its worker killed"
            };
            // The dead worker's lease ends (the driver's takeover, tested with the pagers).
            sqlx::query("UPDATE core.dead_letter_operations SET claimed_until = NULL")
                .execute(&self.pool)
                .await
                .expect("ending the lease");
            // A send the dead worker had in flight may still land.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if cut % 2 == 0 {
                did += &self.withdraw_one_left(op.id).await;
            }
        }
        for _ in 0..20 {
            let round = operations::work(&tools, until(), 10)
                .await
                .expect("a round");
            if round.operations == 0 {
                break;
            }
        }
        let op = operations::get(&self.pool, op.id)
            .await
            .expect("the operation")
            .expect("it exists");
        let p = op.progress;
        did += &format!(
            ": {}; replayed {} (sent {}), already processed {}, discarded {}, left pending {}",
            op.status,
            p.replayed,
            p.sent,
            p.already_processed,
            p.discarded,
            p.skipped_not_replayable + p.skipped_not_sendable
        );
        self.log.push(did);
        let received = self.drain(&sqs, &url).await;
        self.take_replays(received).await;
    }

    /// Everything in the SQS queue, deleted: each message's body, `replay_of` and FIFO group.
    async fn drain(
        &self,
        sqs: &aws_sdk_sqs::Client,
        url: &str,
    ) -> Vec<(String, Option<String>, Option<String>)> {
        let mut all = Vec::new();
        loop {
            let got = sqs
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                .send()
                .await
                .expect("ReceiveMessage");
            let messages = got.messages.unwrap_or_default();
            if messages.is_empty() {
                return all;
            }
            for m in messages {
                let replay_of = m
                    .message_attributes
                    .as_ref()
                    .and_then(|a| a.get(shared::dead_letter::REPLAY_OF_ATTRIBUTE))
                    .and_then(|v| v.string_value.clone());
                let group = m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                    .cloned();
                sqs.delete_message()
                    .queue_url(url)
                    .receipt_handle(m.receipt_handle.unwrap_or_default())
                    .send()
                    .await
                    .expect("DeleteMessage");
                all.push((m.body.unwrap_or_default(), replay_of, group));
            }
        }
    }

    /// The replays the operation sent, into the history's queue as the messages they are.
    async fn take_replays(&mut self, received: Vec<(String, Option<String>, Option<String>)>) {
        let letters = self.letters().await;
        for (body, replay_of, group) in received {
            // Only replays reach this queue: one without its letter's id lost the link that
            // makes a replay that fails again a letter of the same job's record (the outside
            // attack on traces found the one-letter route sending none).
            let Some(letter) = replay_of.and_then(|r| r.parse::<uuid::Uuid>().ok()) else {
                panic!("a replay arrived without its replay_of attribute: {body}");
            };
            let Some((_, i)) = letters.iter().find(|(l, _)| l.id == letter) else {
                continue; // another history's (a send that landed late)
            };
            let i = *i;
            let family = i.and_then(|i| self.msgs[i].family);
            let slot = i.and_then(|i| self.msgs[i].slot);
            let label = match family {
                Some(f) => format!("{f:?} bulk replay"),
                None => "bulk replay of a non-job".into(),
            };
            let unreadable = i.is_some_and(|i| self.msgs[i].unreadable);
            let r = self.push(body, family, slot, label);
            let m = &mut self.msgs[r];
            m.unreadable = unreadable;
            m.replay_of = Some(DeadLetterId(letter));
            if self.cfg.fifo {
                m.group = group;
            }
            let name = self.msgs[r].name.clone();
            let of = self.letter_name(i);
            self.log
                .push(format!("the replay of {of} arrives as {name}"));
        }
    }

    /// The operator withdraws a replay the dead worker recorded and never sent (found by the
    /// outside attack: the next worker must not send it): as the API's withdraw route does.
    async fn withdraw_one_left(&mut self, operation: uuid::Uuid) -> String {
        let left: Option<uuid::Uuid> = sqlx::query_scalar(
            "SELECT id FROM core.dead_letters
             WHERE operation_id = $1 AND replay_outcome = 'queued' ORDER BY id LIMIT 1",
        )
        .bind(operation)
        .fetch_optional(&self.pool)
        .await
        .expect("the queued replays");
        let Some(id) = left else {
            return String::new();
        };
        let letters = self.letters().await;
        let i = letters
            .iter()
            .find(|(l, _)| l.id == id)
            .and_then(|(_, i)| *i);
        let answer = shared::dead_letter::withdraw_replay(
            &self.pool,
            DeadLetterId(id),
            super::OPERATOR,
            "model: withdrawn while its operation runs",
            self.clock.now(),
        )
        .await
        .expect("withdrawing");
        self.withdrawals.push((i, true, answer));
        format!(
            ", the replay of {} withdrawn meanwhile: {answer:?}",
            self.letter_name(i)
        )
    }
}
