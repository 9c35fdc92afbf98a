//! The broker's command line, shared by `examples/broker.rs` and the
//! `mailring-broker` binary.

use std::io::Write;
use std::process::ExitCode;

/// Prints a line to stdout, ignoring a closed stdout (`broker | head -1`
/// must not make the server panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

use crate::{Broker, BrokerConfig};

fn usage() -> &'static str {
    "usage: broker [--port N] [--bind ADDR] [--shards N] [--dir PATH] \
     [--appendfsync always|everysec|no] [--requirepass PASS] [--maxclients N] [--spin-us N]\n\
     \x20      [--stream-cache BYTES] [--segment-bytes BYTES] [--no-direct-io] [--no-preallocate]\n\
     \x20      [--always-flush adaptive|write-through|write-then-sync]\n\
     \x20      [--repair-log] [--allow-thp] [--cpus LIST] [--spread-connections]\n\
     \x20      [--tls-cert PEM --tls-key PEM]\n\
     \x20      broker --bench [--producers N] [--consumers N] [--pipeline N] \
     [--payload BYTES] [--streams N] [--duration SECS]\n\
     \x20             [--dir PARENT] [--appendfsync ...] [--shards N] [and the store's and shards' flags]"
}

/// Parses a flag's number.
fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.parse().map_err(|e| format!("{flag}: {v}: {e}"))
}

/// Runs the broker with command-line `args` (without the program name):
/// serves until Ctrl-C or SIGTERM.
pub fn run(args: impl IntoIterator<Item = String>) -> ExitCode {
    let mut config = BrokerConfig::default();
    let mut bench = false;
    let mut bench_config = crate::bench::BenchConfig::default();
    // Flags only a serving broker takes, and flags only the bench takes:
    // given to the other, they are refused rather than ignored.
    let mut serving_flags: Vec<String> = Vec::new();
    let mut bench_flags: Vec<String> = Vec::new();
    let mut bind = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut port = 6379u16;
    let mut allow_thp = false;
    let mut tls_cert: Option<std::path::PathBuf> = None;
    let mut tls_key: Option<std::path::PathBuf> = None;
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let value = |args: &mut dyn Iterator<Item = String>| {
            args.next().ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--port" | "--bind" | "--requirepass" | "--tls-cert" | "--tls-key" | "--maxclients" => {
                serving_flags.push(flag.clone())
            }
            "--producers" | "--consumers" | "--pipeline" | "--payload" | "--streams"
            | "--duration" => bench_flags.push(flag.clone()),
            _ => {}
        }
        let res: Result<(), String> = (|| {
            match flag.as_str() {
                "--port" => {
                    port = value(&mut args)?
                        .parse()
                        .map_err(|e| format!("--port: {e}"))?
                }
                "--bind" => {
                    bind = value(&mut args)?
                        .parse()
                        .map_err(|e| format!("--bind: {e}"))?
                }
                "--shards" => {
                    config.shards = num("--shards", value(&mut args)?)?;
                    if !(1..=mailring::MAX_SHARDS).contains(&config.shards) {
                        return Err(format!(
                            "--shards: {}: from 1 to {}",
                            config.shards,
                            mailring::MAX_SHARDS
                        ));
                    }
                    bench_config.shards = config.shards;
                }
                "--maxclients" => {
                    config.max_clients = num("--maxclients", value(&mut args)?)?;
                    if config.max_clients == 0 {
                        return Err("--maxclients: at least 1".to_owned());
                    }
                }
                "--no-direct-io" => config.store.direct_io = false,
                "--always-flush" => {
                    let v = value(&mut args)?;
                    config.store.always_flush =
                        crate::store::AlwaysFlush::parse(&v).ok_or_else(|| {
                            format!(
                                "--always-flush: {v}: adaptive, write-through or write-then-sync"
                            )
                        })?;
                }
                "--no-preallocate" => config.store.preallocate = false,
                "--repair-log" => config.store.repair_log = true,
                "--spread-connections" => config.spread_connections = true,
                "--allow-thp" => allow_thp = true,
                "--cpus" => {
                    // Shard i on the i-th CPU of the list (wrapping): "1,0".
                    let v = value(&mut args)?;
                    let cpus = v
                        .split(',')
                        .map(|c| num::<usize>("--cpus", c.trim().to_owned()))
                        .collect::<Result<Vec<_>, _>>()?;
                    config.cpus = Some(cpus);
                }
                "--segment-bytes" => {
                    config.store.segment_bytes = num(&flag, value(&mut args)?)?;
                }
                "--stream-cache" => {
                    config.store.stream_cache_bytes = num(&flag, value(&mut args)?)?;
                }
                "--spin-us" => {
                    let us: u64 = num(&flag, value(&mut args)?)?;
                    config.idle_spin = Some(std::time::Duration::from_micros(us));
                }
                "--bench" => bench = true,
                "--producers" => bench_config.producers = num(&flag, value(&mut args)?)?,
                "--consumers" => bench_config.consumers = num(&flag, value(&mut args)?)?,
                "--pipeline" => bench_config.pipeline = num(&flag, value(&mut args)?)?,
                "--payload" => bench_config.payload = num(&flag, value(&mut args)?)?,
                "--streams" => bench_config.streams = num(&flag, value(&mut args)?)?,
                "--duration" => {
                    let secs: f64 = num(&flag, value(&mut args)?)?;
                    // `Duration::from_secs_f64` panics on what no duration
                    // is (NaN, infinite, past u64 seconds): refused here.
                    bench_config.duration = (secs > 0.0)
                        .then(|| std::time::Duration::try_from_secs_f64(secs).ok())
                        .flatten()
                        .filter(|d| *d <= crate::bench::MAX_DURATION)
                        .ok_or_else(|| {
                            format!(
                                "--duration: {secs}: seconds, more than 0 and at most {}",
                                crate::bench::MAX_DURATION.as_secs()
                            )
                        })?;
                }
                "--dir" => {
                    let dir: std::path::PathBuf = value(&mut args)?.into();
                    bench_config.parent_dir = Some(dir.clone());
                    config.store.dir = dir;
                }
                "--appendfsync" => {
                    let v = value(&mut args)?;
                    config.store.fsync = crate::Fsync::parse(&v)
                        .ok_or_else(|| format!("--appendfsync: {v}: always, everysec or no"))?;
                    bench_config.fsync = config.store.fsync;
                }
                // Empty: no password, as Redis takes `requirepass ""`.
                "--requirepass" => {
                    config.requirepass = Some(value(&mut args)?)
                        .filter(|p| !p.is_empty())
                        .map(Into::into)
                }
                "--tls-cert" => tls_cert = Some(value(&mut args)?.into()),
                "--tls-key" => tls_key = Some(value(&mut args)?.into()),
                "-h" | "--help" => return Err(usage().to_owned()),
                other => return Err(format!("unknown flag {other}\n{}", usage())),
            }
            Ok(())
        })();
        if let Err(e) = res {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    if let (false, Some(flag)) = (bench, bench_flags.first()) {
        eprintln!("{flag} applies only with --bench\n{}", usage());
        return ExitCode::from(2);
    }
    config.tls = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => Some(crate::TlsFiles { cert, key }),
        (None, None) => None,
        _ => {
            eprintln!("--tls-cert and --tls-key go together\n{}", usage());
            return ExitCode::from(2);
        }
    };
    if !allow_thp {
        // As Redis's `disable-thp yes`: a huge page's first touch stalls
        // the shard that makes it for milliseconds (docs/broker.md).
        if let Err(e) = mailring::process::disable_transparent_huge_pages() {
            eprintln!(
                "broker: could not turn transparent huge pages off ({e}); \
                 expect latency spikes while memory grows"
            );
        }
    }
    if bench {
        if let Some(flag) = serving_flags.first() {
            eprintln!(
                "{flag} does not apply to --bench: it serves on a loopback port of its own, without password or TLS\n{}",
                usage()
            );
            return ExitCode::from(2);
        }
        if let Err(e) = bench_config.check() {
            eprintln!("{e}\n{}", usage());
            return ExitCode::from(2);
        }
        return match crate::bench::run(&bench_config, config) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("broker --bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    config.addr = std::net::SocketAddr::new(bind, port);
    let broker = match Broker::start(config) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("broker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = broker.recovery();
    say!(
        "recovered {} streams ({} records, {} bytes) in {:.1?}{}{}",
        r.streams,
        r.records,
        r.bytes,
        r.elapsed,
        if r.migrated {
            "; logs rewritten for this shard count"
        } else {
            ""
        },
        if r.cut.is_empty() {
            String::new()
        } else {
            format!("; cut torn or corrupt tails: {:?}", r.cut)
        }
    );
    say!("mailring broker listening on {}", broker.local_addr());
    if let Err(e) = broker.wait_for_signal() {
        eprintln!("broker: signals: {e}");
        return ExitCode::FAILURE;
    }
    say!("shutting down");
    match broker.shutdown_checked() {
        Ok(()) => ExitCode::SUCCESS,
        // Said on stderr as it failed; the exit status says it too.
        Err(_) => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::run;
    use std::process::ExitCode;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn flags_no_value_can_take_are_refused_with_a_message_not_a_panic() {
        for bad in [
            &["--bench", "--duration", "inf"][..],
            &["--bench", "--duration", "1e300"],
            &["--bench", "--duration", "NaN"],
            &["--bench", "--duration", "0"],
            &["--bench", "--duration", "-5"],
            &["--bench", "--duration", "3601"],
            &["--bench", "--consumers", "5"],
            &["--bench", "--producers", "0"],
            &["--bench", "--pipeline", "0"],
            &["--bench", "--payload", "600000000"],
            &["--bench", "--port", "7000"],
            &["--bench", "--requirepass", "x"],
            &["--duration", "5"],
            &["--producers", "2", "--port", "7000"],
            &["--shards", "0"],
            &["--shards", "100000"],
            &["--port", "70000"],
            &["--port", "-1"],
            &["--appendfsync", "sometimes"],
            &["--always-flush", "sometimes"],
            &["--always-flush"],
            &["--maxclients", "0"],
            &["--maxclients", "-3"],
            &["--bench", "--maxclients", "5"],
            &["--tls-cert", "x.pem"],
            &["--nope"],
            &["--dir"],
        ] {
            assert_eq!(run(args(bad)), ExitCode::from(2), "{bad:?}");
        }
    }
}
