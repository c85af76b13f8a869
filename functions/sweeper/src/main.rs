//! The Lambda entry point; everything is in [`sweeper::run`].

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Boxed: the whole service future is deep enough to overflow the compiler's layout
    // query depth in release builds (seen with cargo lambda build --release).
    Box::pin(sweeper::run()).await
}
