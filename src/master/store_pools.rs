//! The master's connections to its stores (for the orders and copies it sends them): one pool
//! per store endpoint, each proving the cluster secret when there is one.

use crate::transfer::{ConnOptions, Pool};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A pool of connections per store endpoint.
pub struct StorePools {
    auth: Option<Arc<crate::auth::Secret>>,
    /// How long one request may take (it may copy megabytes to or from a disk).
    io_timeout: Duration,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
}

impl StorePools {
    /// Connection pools to the stores, authenticated with `auth`, each call given `io_timeout`.
    pub fn new(auth: Option<Arc<crate::auth::Secret>>, io_timeout: Duration) -> StorePools {
        StorePools {
            auth,
            io_timeout,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// The pool of the store at `endpoint`, made at its first use.
    pub fn get(&self, endpoint: &str) -> Arc<Pool> {
        self.pools
            .lock()
            .entry(endpoint.to_owned())
            .or_insert_with(|| {
                Arc::new(Pool::new(
                    endpoint.to_owned(),
                    ConnOptions {
                        connect_timeout: Duration::from_secs(1),
                        io_timeout: self.io_timeout,
                        spin: Duration::ZERO,
                        auth: self.auth.clone(),
                    },
                ))
            })
            .clone()
    }
}
