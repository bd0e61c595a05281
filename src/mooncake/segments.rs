//! Segments Mooncake's own processes mount (a wheel process with a global segment, Mooncake's
//! store service): mounted in the master as segments no rbgctl store serves, reached by
//! Mooncake's Transfer Engine at the addresses the process gave. Their objects go with them:
//! on `UnmountSegment`, and when the process stops pinging for the client TTL (the master
//! drops a client's segments, and a segment without an incarnation id is not kept for a
//! return). Only Mooncake's puts are placed on them (`Reach::MooncakeTe`).
//!
//! Mooncake names segments by UUID, rbgctl by number: the map between them is kept here, and
//! rebuilt by the client's `ReMountSegment` after a master restart or failover (its Ping is
//! answered NEED_REMOUNT by a master that does not know it).

use super::master::{call, Fail};
use super::types::{error_code, Segment, Uuid};
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{MountReq, SegmentInfo, Tier, UnmountReq};
use crate::transfer::rpc;
use parking_lot::Mutex;
use std::collections::HashMap;

type Expected<T> = Result<T, i32>;

/// Mounted segments kept at most (each Mooncake process mounts one or a few).
pub const MAX_MOUNTS: usize = 65_536;

/// Mooncake's segment UUIDs and the master's ids for them.
#[derive(Debug, Default)]
pub(super) struct Mounts {
    by_uuid: Mutex<HashMap<Uuid, u64>>,
}

/// The master's description of a segment a Mooncake process mounts.
fn info_of(seg: &Segment) -> SegmentInfo {
    SegmentInfo {
        name: seg.name.clone(),
        // No rbgctl store serves it.
        endpoint: String::new(),
        size: seg.size,
        host_id: seg.host_id.clone(),
        // No incarnation: nothing to report after a restart, nothing kept after the process.
        segment_uuid: 0,
        tier: Tier::Memory,
        persistent: false,
        te_endpoint: seg.te_endpoint.clone(),
        te_data_port: 0,
        te_base: seg.base,
        ..SegmentInfo::default()
    }
}

impl Mounts {
    /// `MountSegment` (and each segment of a `ReMountSegment`: mounting again what is mounted
    /// is no error).
    pub(super) fn mount(
        &self,
        service: &dyn crate::transfer::server::Service,
        client_id: u64,
        seg: &Segment,
    ) -> Result<Expected<()>, Fail> {
        // The transports whose descriptors rbgctl's clients read (Mooncake's own find theirs).
        if seg.protocol != "tcp" && seg.protocol != "rdma" {
            tracing::warn!(segment = %seg.name, protocol = %seg.protocol,
                "a Mooncake process mounted a segment for a transport rbgctl does not serve \
                 (tcp and rdma only); refused");
            return Ok(Err(error_code::INVALID_PARAMS));
        }
        if seg.name.is_empty() || seg.te_endpoint.is_empty() || seg.base == 0 || seg.size == 0 {
            return Ok(Err(error_code::INVALID_PARAMS));
        }
        if seg.base.checked_add(seg.size).is_none() {
            return Ok(Err(error_code::INVALID_PARAMS));
        }
        let full = {
            let mounted = self.by_uuid.lock();
            !mounted.contains_key(&seg.id) && mounted.len() >= MAX_MOUNTS
        };
        if full {
            tracing::warn!(
                limit = MAX_MOUNTS,
                "Mooncake segments at their limit; refused"
            );
            return Ok(Err(error_code::NO_AVAILABLE_HANDLE));
        }
        // The master checks no grant on a segment no store serves; a key it needs all the same.
        let key = GrantKey::generate().map_err(|_| Fail::Code(error_code::INTERNAL_ERROR))?;
        let req = MountReq {
            client_id,
            segment: info_of(seg),
            recovering: false,
            grant_key: key.bytes().to_vec(),
        };
        match call::<rpc::MountSegment>(service, &req) {
            Ok(r) => {
                let before = self.by_uuid.lock().insert(seg.id, r.segment_id);
                if before != Some(r.segment_id) {
                    tracing::info!(segment = %seg.name, te_endpoint = %seg.te_endpoint,
                        bytes = seg.size, segment_id = r.segment_id,
                        "a Mooncake process mounted a segment");
                }
                Ok(Ok(()))
            }
            Err(Fail::Code(code)) => Ok(Err(code)),
            Err(f) => Err(f),
        }
    }

    /// `UnmountSegment` (and `GracefulUnmountSegment`: its objects go at once, as with
    /// Mooncake when no copy elsewhere exists).
    pub(super) fn unmount(
        &self,
        service: &dyn crate::transfer::server::Service,
        client_id: u64,
        segment: Uuid,
    ) -> Result<Expected<()>, Fail> {
        let Some(segment_id) = self.by_uuid.lock().remove(&segment) else {
            return Ok(Err(error_code::SEGMENT_NOT_FOUND));
        };
        let req = UnmountReq {
            client_id,
            segment_id,
            keep: false,
        };
        match call::<rpc::UnmountSegment>(service, &req) {
            Ok(()) => Ok(Ok(())),
            Err(Fail::Code(code)) => Ok(Err(code)),
            Err(f) => Err(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mooncake_segment_is_served_by_no_store_and_kept_for_no_return() {
        let seg = Segment {
            id: Uuid(1, 2),
            name: "127.0.0.1:13081".into(),
            base: 0x7f00_0000_0000,
            size: 64 << 20,
            te_endpoint: "127.0.0.1:13081".into(),
            protocol: "tcp".into(),
            host_id: "h".into(),
        };
        let info = info_of(&seg);
        assert!(info.endpoint.is_empty());
        assert_eq!(info.segment_uuid, 0);
        assert!(!info.persistent);
        assert_eq!((info.te_base, info.size), (seg.base, seg.size));
        assert_eq!(info.te_endpoint, seg.te_endpoint);
    }
}
