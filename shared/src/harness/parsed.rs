//! A message's body, read once as the consumer's job (or poison), and what a batch keys it by.

use super::{Harness, IncomingMessage};
use crate::consumer::Consumer;
use crate::envelope::{Envelope, JobDigest, PartialIds, Poison};
use crate::ids::JobId;

/// A message's body read as the consumer's job: its envelope and digest, or poison. Read once
/// per message, by [`Harness::parse`], and carried from there.
pub(super) type Parsed<P> = Result<ParsedJob<P>, Poison>;

/// A body that is a job: its envelope, and the digest of what makes up the job.
pub(super) type ParsedJob<P> = (Envelope<P>, JobDigest);

/// One record, by its index in the SQS batch, with its parsed body.
pub(super) type Record<P> = (usize, Parsed<P>);

/// The ids a parsed message carries: all of them, or what a poison body still had.
pub(super) fn ids_of<P>(parsed: &Parsed<P>) -> PartialIds {
    match parsed {
        Ok((envelope, _)) => envelope.ids(),
        Err(poison) => poison.ids.clone(),
    }
}

/// The job id a parsed message is keyed by in its batch (the fence lookup, the commit group,
/// the ledger): the envelope's, or what a poison body still read as one (none for an
/// ambiguous body).
pub(super) fn key_of<P>(parsed: &Parsed<P>) -> Option<JobId> {
    match parsed {
        Ok((envelope, _)) => Some(envelope.job_id),
        Err(poison) => poison.ids.job_id,
    }
}

/// The digest a parsed message is compared by: the job's, or a poison body's as the fence
/// would compare it (none for a body that is not unambiguous JSON).
pub(super) fn digest_of<P>(parsed: &Parsed<P>) -> Option<JobDigest> {
    match parsed {
        Ok((_, digest)) => Some(*digest),
        Err(poison) => poison.digest.as_deref().copied(),
    }
}

impl<C: Consumer> Harness<C> {
    /// The body of `msg` as this consumer's job.
    pub(super) fn parse(&self, msg: &IncomingMessage) -> Parsed<C::Payload> {
        Envelope::parse_job(&msg.body, self.consumer.job_fields())
    }
}
