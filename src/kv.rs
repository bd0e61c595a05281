//! `rbgctl kv`: a command-line client of the pool, for trying it out and for scripts.

use crate::client::{Client, ClientConfig, ReplicateConfig};
use clap::{Args, Subcommand};
use std::io::{Read, Write};

#[derive(Debug, Args)]
pub struct KvArgs {
    /// The master's RPC address.
    #[arg(long, env = "MOONCAKE_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    #[command(subcommand)]
    pub op: KvOp,
}

#[derive(Debug, Subcommand)]
pub enum KvOp {
    /// Store a value (from the argument, or standard input when it is `-`).
    Put {
        key: String,
        value: String,
        #[arg(long, default_value_t = 1)]
        replicas: u8,
        #[arg(long)]
        soft_pin: bool,
        #[arg(long, default_value = "")]
        preferred_segment: String,
    },
    /// Print a value to standard output.
    Get { key: String },
    /// Exit 0 when the key exists, 1 when not.
    Exists { key: String },
    /// Remove a key.
    Rm {
        key: String,
        #[arg(long)]
        force: bool,
    },
    /// List the mounted segments.
    Segments,
}

/// What a `kv` command can fail with: the pool's answer, or this process's own I/O.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub fn run(args: KvArgs) -> Result<(), KvError> {
    let client = Client::connect(ClientConfig::new(args.master))?;
    match args.op {
        KvOp::Put {
            key,
            value,
            replicas,
            soft_pin,
            preferred_segment,
        } => {
            let bytes = if value == "-" {
                let mut b = Vec::new();
                std::io::stdin().read_to_end(&mut b)?;
                b
            } else {
                value.into_bytes()
            };
            let cfg = ReplicateConfig {
                replica_num: replicas,
                soft_pin,
                soft_pin_ttl_ms: 0,
                preferred_segment,
            };
            client.put(&key, &bytes, &cfg)?;
            eprintln!("stored {key:?} ({} bytes)", bytes.len());
        }
        KvOp::Get { key } => {
            let v = client.get(&key)?;
            std::io::stdout().write_all(&v)?;
        }
        KvOp::Exists { key } => {
            let e = client.exists(&key)?;
            println!("{e}");
            if !e {
                std::process::exit(1);
            }
        }
        KvOp::Rm { key, force } => {
            client.remove(&key, force)?;
            eprintln!("removed {key:?}");
        }
        KvOp::Segments => {
            for s in client.segments()? {
                println!(
                    "{}\t{}\tused {} of {}",
                    s.info.name,
                    s.info.endpoint,
                    crate::config::human_bytes(s.used),
                    crate::config::human_bytes(s.info.size)
                );
            }
        }
    }
    Ok(())
}
