use anyhow::Context;
use clap::Parser;

use astraeus::settings::{Cli, Command};
use astraeus::{admin, agent, api, bench, dev, server, sim, telemetry};

/// glibc's malloc took up to a third of the server's CPU with 10,000 machines connected.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => server::serve(args).await,
        Command::Admin(command) => admin::run(command).await,
        Command::Agent(args) => {
            let config = agent::Config::from_args(&args)?;
            let stop = tokio_util::sync::CancellationToken::new();
            tokio::spawn({
                let stop = stop.clone();
                async move {
                    server::shutdown_signal().await;
                    stop.cancel();
                }
            });
            agent::run(config, stop).await
        }
        Command::Dev(args) => dev::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Sim(args) => sim::run(args).await,
        Command::Openapi { out } => {
            let json = api::openapi().to_pretty_json().context("cannot render the OpenAPI document")? + "\n";
            match out {
                Some(path) => {
                    std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))
                }
                None => {
                    print!("{json}");
                    Ok(())
                }
            }
        }
    }
}
