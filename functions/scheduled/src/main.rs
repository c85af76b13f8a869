//! The Lambda entry point; everything is in [`scheduled::run`].

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Boxed: the whole service future is deep enough to overflow the compiler's layout
    // query depth in release builds (seen with cargo lambda build --release).
    Box::pin(scheduled::run()).await
}
