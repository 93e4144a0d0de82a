//! `astra`: the Astraeus command line, a client of the public REST API.

use std::process::ExitCode;

use clap::Parser;

use astraeus::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(astraeus::cli::main(cli)),
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}
