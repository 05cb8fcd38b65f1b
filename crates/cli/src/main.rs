//! `gpuplex`: serve GPUs to guests, run programs against a server, inspect
//! one, and measure what going through gpuplex costs.

mod bench;
mod info;
mod relay;
mod run;
mod serve;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpuplex_server::sched::Policy;
use gpuplex_server::BackendKind;
use gpuplex_transport::{Address, Token};

/// Share GPUs between isolated guests: unmodified CUDA programs run against
/// gpuplex's libcuda.so.1, which sends their driver calls to a gpuplex server
/// that owns the GPUs.
#[derive(Parser)]
#[command(version, propagate_version = true, after_help = EXAMPLES)]
struct Cli {
    /// How to log: `text` (coloured on a terminal only) or `json`, one
    /// object a line. Default: GPUPLEX_LOG_FORMAT, else text. The level is
    /// GPUPLEX_LOG (error, warn, info, debug).
    #[arg(long, global = true, value_name = "text|json")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr at GPUPLEX_LOG's level (else `default_level`), in the
/// format asked for, which the server's worker processes inherit.
fn init_logging(format: Option<LogFormat>, default_level: &str) {
    const FORMAT_ENV: &str = "GPUPLEX_LOG_FORMAT";
    let format = format.unwrap_or_else(|| match std::env::var(FORMAT_ENV).as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    });
    // Still one thread: nothing reads the environment concurrently.
    std::env::set_var(FORMAT_ENV, if format == LogFormat::Json { "json" } else { "text" });
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUPLEX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
}

const EXAMPLES: &str = "Examples:
  gpuplex run -- ./app               run ./app on this machine's GPUs (starts a server if none runs)
  gpuplex serve &                    keep a shared server on the default socket
  gpuplex status                     show its devices, tenants and sessions
  gpuplex serve --config /etc/gpuplex/gpuplex.toml --metrics 127.0.0.1:9400
                                     tenants with memory limits; Prometheus metrics at /metrics
  gpuplex serve --listen unix:/run/gpuplex.sock
  GPUPLEX_SERVER=unix:/run/gpuplex.sock ./app   use a server without `gpuplex run`
                                     (needs gpuplex's libcuda.so.1 on LD_LIBRARY_PATH)
  head -c 32 /dev/urandom | base64 > token && chmod 600 token
  gpuplex serve --listen tcp:0.0.0.0:7070 --token-file token
                                     serve remote guests that hold the same token (not encrypted)
  gpuplex run --server tcp:gpu-host:7070 --token-file token -- ./app

  gpuplex run --backend emulated -- ./test   no GPU here: the host-memory test device
                                     (in a build with --features emulated)
  gpuplex bench --json bench.json    microbenchmarks natively and through each carrier, side by side
  gpuplex bench --backend emulated --quick --carriers socket   a quick check without a GPU
  gpuplex bench --tenants 8 --high   8 tenants and a high-priority one sharing the GPU, natively
                                     and through gpuplex (fair, none); run as root for uids";

#[derive(Subcommand)]
enum Command {
    /// Run the server: own the GPUs and serve guests' CUDA calls.
    Serve(serve::Options),
    /// One guest's worker process, started by the server.
    #[command(hide = true)]
    Worker {
        #[arg(long, value_name = "cuda|emulated")]
        backend: BackendKind,
    },
    /// Run a program with its CUDA calls served by gpuplex.
    ///
    /// The program finds gpuplex's libcuda.so.1 first on its library path.
    /// Without --server it uses the server named by GPUPLEX_SERVER or listening
    /// on the default socket, and if there is none it starts one inside this
    /// command for the program's lifetime.
    Run {
        /// The server to use (unix:PATH, tcp:HOST:PORT, or in a VM vm); it must be reachable.
        #[arg(long, value_name = "ADDR")]
        server: Option<Address>,
        /// The token of a TCP server (else GPUPLEX_TOKEN_FILE); passed on to
        /// the program as GPUPLEX_TOKEN_FILE.
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// The backend of the server started here when none is reachable.
        #[arg(long, default_value = "cuda", value_name = "cuda|emulated")]
        backend: BackendKind,
        /// At the program's exit, print a table of every CUDA driver
        /// function it called: calls, errors, how many waited for the
        /// server, and the time spent waiting (sets GPUPLEX_TRACE=1).
        #[arg(long)]
        trace: bool,
        /// The program and its arguments (after `--` where they start with a `-`).
        #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
        command: Vec<std::ffi::OsString>,
    },
    /// Show a server's devices, tenants and sessions.
    ///
    /// The server's owner sees every tenant; anyone else sees only their
    /// own tenant's sessions.
    #[command(alias = "info")]
    Status {
        /// The server to ask (unix:PATH or tcp:HOST:PORT). Default:
        /// GPUPLEX_SERVER, else the default socket.
        #[arg(long, value_name = "ADDR")]
        server: Option<Address>,
        /// The token of a TCP server (else GPUPLEX_TOKEN_FILE).
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// Print JSON (keys `tenants` and `sessions`) instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Measure driver-call costs natively and through gpuplex, side by side.
    ///
    /// Runs the same microbenchmarks (kernel launch, launch + sync, 4-byte
    /// copies, allocation, copy bandwidth from pageable and pinned memory)
    /// against the machine's libcuda and against gpuplex's front-end on each
    /// carrier, each through a server of its own, and prints every value with
    /// its ratio to native. A carrier whose server cannot start is reported
    /// unavailable and skipped. Exits non-zero if a column that started
    /// failed a measurement or a data check.
    Bench {
        /// cuda measures the GPU natively and through gpuplex; emulated has no
        /// native column (a check that the paths work, not a measurement).
        #[arg(long, default_value = "cuda", value_name = "cuda|emulated")]
        backend: BackendKind,
        /// The carriers to measure, comma-separated.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "shm,socket,tcp")]
        carriers: Vec<bench::CarrierKind>,
        /// Also write the results as JSON to PATH.
        #[arg(long, value_name = "PATH")]
        json: Option<std::path::PathBuf>,
        /// Fewer iterations, shorter copy timings and no 256 MiB copies: seconds, not a minute.
        #[arg(long)]
        quick: bool,
        /// Rounds of every column, an odd number: each adds a sample to every
        /// row, for tighter medians.
        #[arg(long, default_value_t = bench::ROUNDS, value_parser = odd)]
        rounds: usize,
        /// Another build's folder (its gpuplex and libcuda.so): every carrier
        /// is measured through it too, as CARRIER@base, in the same rounds.
        #[arg(long, value_name = "DIR")]
        baseline: Option<PathBuf>,
        /// Starts no round that would end more than SECONDS after the first
        /// began, judged by the slowest so far, and reports the rounds taken
        /// (at least one).
        #[arg(long, value_name = "SECONDS")]
        time_limit: Option<u64>,
        /// Measures only these rows: more rounds of them in the same time,
        /// for a comparison that needs tighter medians.
        #[arg(long, value_enum, value_name = "ROWS")]
        only: Option<bench::worker::Part>,
        #[command(flatten)]
        tenants: TenantArgs,
    },
    /// One tenant of `gpuplex bench --tenants`: a closed loop of the busy
    /// kernel through the libcuda at PATH (or `system`) for SECONDS from
    /// the wall-clock time START, then one JSON line.
    #[command(hide = true)]
    BenchTenant {
        #[arg(long, value_name = "PATH|system")]
        library: String,
        #[arg(long, value_enum)]
        kernel: bench::tenants::Kernel,
        #[arg(long)]
        seconds: f64,
        /// Seconds since the epoch.
        #[arg(long)]
        start: f64,
    },
    /// One column of `gpuplex bench`: measures through the libcuda at PATH
    /// (or `system`: libcuda.so.1 as the dynamic linker finds it) and prints JSON.
    #[command(hide = true)]
    BenchWorker {
        #[arg(long, value_name = "PATH|system")]
        library: String,
        #[arg(long)]
        quick: bool,
        /// Samples of each metric.
        #[arg(long, default_value_t = 1)]
        samples: usize,
        /// Only these rows (default: all).
        #[arg(long, value_enum)]
        part: Option<bench::worker::Part>,
        /// Stay up and answer one sample of each latency row named on stdin.
        #[arg(long, conflicts_with_all = ["part", "samples"])]
        turns: bool,
    },
}

/// `gpuplex bench --tenants N`: how tenants share a GPU, instead of the
/// microbenchmarks.
#[derive(clap::Args)]
#[command(next_help_heading = "Tenants (instead of the microbenchmarks)")]
struct TenantArgs {
    /// N tenants, each a process running the same kernel loop: first one
    /// alone, then all together, natively (and under MPS where there is
    /// one) and through gpuplex under each --policy. Prints each tenant's
    /// kernels per second, p50/p99 latency and share of GPU time, Jain's
    /// index and the aggregate against one tenant alone.
    #[arg(long, value_name = "N", conflicts_with_all = ["carriers", "quick", "rounds", "baseline", "time_limit"])]
    tenants: Option<usize>,
    /// Each tenant's weight, one per tenant (default: all 1).
    #[arg(long, value_delimiter = ',', value_name = "W,W,...", requires = "tenants")]
    weights: Vec<u32>,
    /// The kernel every tenant runs (the --high tenant runs small).
    #[arg(long, value_enum, default_value = "long", value_name = "long|small", requires = "tenants")]
    kernel: bench::tenants::Kernel,
    /// The gpuplex policies to run the tenants under, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "fair|fifo|band|none",
        default_value = "fair,none",
        requires = "tenants"
    )]
    policy: Vec<Policy>,
    /// The last K tenants are configured (with their weights) but start no process.
    #[arg(long, value_name = "K", default_value_t = 0, requires = "tenants")]
    idle: usize,
    /// One more tenant, of priority high, running the small kernel beside
    /// the others: its p50/p99 latency alone and among them.
    #[arg(long, requires = "tenants")]
    high: bool,
    /// Each run's window.
    #[arg(long, value_name = "SECONDS", default_value_t = 4.0, requires = "tenants")]
    seconds: f64,
    /// Writes `sharing = VALUE` into each tenant's table of the servers' configuration.
    #[arg(long, value_name = "isolated|spatial", requires = "tenants")]
    sharing: Option<bench::tenants::Sharing>,
    /// The servers' slice (`serve --slice`; default theirs, 10ms): to weigh
    /// hand-overs against how long waiters wait.
    #[arg(long, value_name = "TIME", value_parser = gpuplex_server::config::parse_slice, requires = "tenants")]
    slice: Option<std::time::Duration>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, if matches!(cli.command, Command::Serve { .. }) { "info" } else { "warn" });

    let result = match cli.command {
        Command::Serve(options) => serve::serve(options),
        Command::Worker { backend } => return ExitCode::from(gpuplex_server::worker::run(backend) as u8),
        Command::Run { server, token_file, backend, trace, command } => {
            run::run(server, token_file.as_deref(), backend, trace, &command)
        }
        Command::Status { server, token_file, json } => info::status(server, token_file.as_deref(), json),
        Command::Bench { backend, carriers, json, quick, rounds, baseline, time_limit, only, tenants: t } => {
            match t.tenants {
                Some(tenants) => bench::tenants::bench(bench::tenants::Options {
                    backend,
                    tenants,
                    weights: t.weights,
                    kernel: t.kernel,
                    policies: t.policy,
                    idle: t.idle,
                    high: t.high,
                    seconds: t.seconds,
                    sharing: t.sharing,
                    slice: t.slice,
                    json,
                }),
                None => {
                    let time_limit = time_limit.map(std::time::Duration::from_secs);
                    bench::bench(bench::Options { backend, carriers, json, quick, rounds, baseline, time_limit, only })
                }
            }
        }
        Command::BenchTenant { library, kernel, seconds, start } => {
            bench::tenants::child(&library, kernel, seconds, start)
        }
        Command::BenchWorker { library, quick, samples, part, turns } => {
            bench::worker::run(&library, quick, samples, part, turns)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuplex: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// An odd positive number, as `--rounds` takes (the median is then a sample).
fn odd(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n % 2 == 1 => Ok(n),
        _ => Err(format!("{s:?} is not an odd positive number")),
    }
}

pub use gpuplex_server::chain;

/// The token a client shows `address`: `--token-file`, else
/// GPUPLEX_TOKEN_FILE. Only TCP uses one.
pub fn client_token(address: &Address, token_file: Option<&Path>) -> Result<Option<Token>, Error> {
    if !matches!(address, Address::Tcp(_)) {
        return Ok(None);
    }
    Ok(match token_file {
        Some(path) => Some(Token::from_file(path)?),
        None => Token::from_env()?,
    })
}

/// The server a client would use: GPUPLEX_SERVER, else the default socket.
pub fn default_server() -> Result<Address, Error> {
    match std::env::var("GPUPLEX_SERVER") {
        Ok(a) if !a.is_empty() => Ok(a.parse().map_err(|e| format!("GPUPLEX_SERVER: {e}"))?),
        _ => Ok(Address::default_local()),
    }
}
