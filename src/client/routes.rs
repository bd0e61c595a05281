//! What a client knows about the pool's segments: for each mounted segment, where its store is
//! and the data path that reaches it. Learnt from the master's segment list and refreshed when
//! a put or get names a segment this client has not seen.

use super::datapath::{self, DataPath};
use crate::transfer::message::{SegmentEntry, SegmentInfo};
use crate::transfer::{ConnOptions, Pool};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A mounted segment and how to reach it.
pub struct Route {
    pub segment_id: u64,
    pub info: SegmentInfo,
    pub path: Arc<dyn DataPath>,
    /// When a transfer to this segment last failed (cleared by the next success).
    failed_at: Mutex<Option<Instant>>,
}

/// How long a segment whose transfer failed is tried after the other replicas: about the
/// master's client TTL, after which an unreachable store is no longer described at all.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);

impl Route {
    /// A transfer failed: until one succeeds (or `SUSPECT_FOR` passes), reads try this
    /// segment's replicas last, so a cut-off store costs one connect timeout, not one per get.
    pub fn failed(&self) {
        *self.failed_at.lock() = Some(Instant::now());
    }

    /// A transfer succeeded: the segment is no longer suspect.
    pub fn succeeded(&self) {
        let mut f = self.failed_at.lock();
        if f.is_some() {
            *f = None;
        }
    }

    /// Failed within `SUSPECT_FOR`.
    pub fn suspect(&self) -> bool {
        self.failed_at
            .lock()
            .is_some_and(|t| t.elapsed() < SUSPECT_FOR)
    }
}

/// Each segment's store and the data path that reaches it, from the master's list.
pub struct Routes {
    host_id: String,
    same_host_shm: bool,
    conn: ConnOptions,
    by_segment: RwLock<HashMap<u64, Arc<Route>>>,
    /// One connection pool per store endpoint, kept across route refreshes.
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    /// The RDMA NICs to reach stores with (transport RDMA); `None`: TCP.
    rdma: datapath::Nics,
    /// How segments Mooncake's processes mounted are found.
    discovery: datapath::Discovery,
}

impl Routes {
    /// No routes yet; a store on host `host_id` is reached through shared memory when
    /// `same_host_shm`, others over `conn`.
    pub fn new(host_id: String, same_host_shm: bool, conn: ConnOptions) -> Routes {
        Routes {
            host_id,
            same_host_shm,
            conn,
            by_segment: RwLock::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            rdma: None,
            discovery: datapath::Discovery::Handshake,
        }
    }

    /// Finds segments Mooncake's processes mounted this way.
    pub fn with_discovery(mut self, discovery: datapath::Discovery) -> Routes {
        self.discovery = discovery;
        self
    }

    /// This client's RDMA side, when its transport is RDMA.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub fn rdma_local(&self) -> Option<&datapath::NicsInner> {
        self.rdma.as_ref()
    }

    /// Reaches stores that serve RDMA through these NICs.
    pub fn with_rdma(mut self, nics: datapath::Nics) -> Routes {
        self.rdma = nics;
        self
    }

    /// The route to segment `segment_id`, once known.
    pub fn get(&self, segment_id: u64) -> Option<Arc<Route>> {
        self.by_segment.read().get(&segment_id).cloned()
    }

    /// Takes the master's current segment list: forgets unmounted segments, opens a data path
    /// for new ones, keeps the rest (and their mapped memory) as they are.
    pub fn update(&self, segments: Vec<SegmentEntry>) {
        let live: HashSet<u64> = segments.iter().map(|s| s.id).collect();
        let mut routes = self.by_segment.write();
        routes.retain(|id, _| live.contains(id));
        for s in segments {
            if routes.contains_key(&s.id) {
                continue;
            }
            let pool = self.pool_for(&s.info.endpoint);
            let path = datapath::open(
                &s.info,
                &self.host_id,
                self.same_host_shm,
                pool,
                self.rdma.as_ref(),
                &self.discovery,
            );
            let route = Route {
                segment_id: s.id,
                info: s.info,
                path,
                failed_at: Mutex::new(None),
            };
            routes.insert(s.id, Arc::new(route));
        }
    }

    fn pool_for(&self, endpoint: &str) -> Arc<Pool> {
        self.pools
            .lock()
            .entry(endpoint.to_string())
            .or_insert_with(|| Arc::new(Pool::new(endpoint, self.conn.clone())))
            .clone()
    }
}
