//! `kestrel`: parse the command line, run it, turn the outcome into an exit code.

use std::process::ExitCode;

fn main() -> ExitCode {
    match kestrel::cli::run() {
        Ok(code) => code,
        Err(err) => {
            // `kestrel generate … | head` closing the pipe is not an error.
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
