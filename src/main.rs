//! Entry point: finds the role the invocation names (`rbgctl::cli::ROLES`) and runs it.

/// mimalloc: the router's many small per-request allocations cost less than with glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // mimalloc asks for transparent huge pages on its arenas, and with a thread per connection
    // each thread's heap then sits in a 2 MiB page of its own: 675 KiB per idle connection
    // instead of 40 KiB (`rbgctl bench abuse`). Off for this process and the roles it starts.
    let _ = nix::sys::prctl::set_thp_disable(true);
    let invocation = match rbgctl::cli::parse(std::env::args_os()) {
        Ok(i) => i,
        Err(e) => e.exit(),
    };
    if let Err(e) = rbgctl::telemetry::init_tracing(&invocation.log_args()) {
        eprintln!("rbgctl: {e}");
        std::process::exit(2);
    }
    invocation.log_parsing();
    if let Err(e) = invocation.run() {
        let mut message = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            cause = c.source();
        }
        eprintln!("rbgctl: {message}");
        std::process::exit(2);
    }
}
