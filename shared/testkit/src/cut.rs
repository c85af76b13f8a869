//! A call cut off after a number of polls: dropped where it stands, as a timeout, a `select!`
//! or an aborted task drops a future (the model's way of killing a worker mid-work).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `call` polled `polls` times at most: its output if it finished by then, `None` if it was
/// dropped (on the poll after its last, which comes once it is woken again).
pub async fn cut_after_polls<F: Future>(call: F, polls: u32) -> Option<F::Output> {
    Polls {
        inner: Box::pin(call),
        left: polls,
    }
    .await
}

struct Polls<F: Future> {
    inner: Pin<Box<F>>,
    left: u32,
}

impl<F: Future> Future for Polls<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        self.inner.as_mut().poll(cx).map(Some)
    }
}
