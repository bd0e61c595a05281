//! The master RPCs of Mooncake's `WrappedMasterService`, by coro_rpc function id: those a
//! Mooncake client calls, which rbgctl's master serves, and the others Mooncake registers,
//! which are answered `NOT_SUPPORTED` rather than "not registered" (they exist, rbgctl has no
//! such feature).

use super::coro_rpc::function_id;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The prefix of every handler's qualified name.
pub const SERVICE: &str = "mooncake::WrappedMasterService::";

/// What Mooncake's master answers `ServiceReady` with, and its clients compare: the store's
/// internal version, not the wheel's.
pub const SERVICE_VERSION: &str = "2.0.0";

macro_rules! rpcs {
    ($($name:ident),+ $(,)?) => {
        /// An RPC rbgctl's master serves to Mooncake's clients.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Rpc { $($name),+ }

        impl Rpc {
            pub const ALL: &'static [Rpc] = &[$(Rpc::$name),+];

            /// The handler's name, without the service prefix.
            pub fn name(self) -> &'static str {
                match self { $(Rpc::$name => stringify!($name)),+ }
            }
        }
    };
}

rpcs!(
    ServiceReady,
    GetStorageConfig,
    GetFsdir,
    MountSegment,
    ReMountSegment,
    UnmountSegment,
    GracefulUnmountSegment,
    Ping,
    FetchTasks,
    MarkTaskToComplete,
    ExistKey,
    BatchExistKey,
    GetReplicaList,
    BatchGetReplicaList,
    GetReplicaListByRegex,
    PutStart,
    PutEnd,
    PutRevoke,
    BatchPutStart,
    BatchPutEnd,
    BatchPutRevoke,
    UpsertStart,
    UpsertEnd,
    UpsertRevoke,
    BatchUpsertStart,
    BatchUpsertEnd,
    BatchUpsertRevoke,
    Remove,
    RemoveByRegex,
    RemoveAll,
    BatchRemove,
);

/// Handlers Mooncake registers for features rbgctl does not have (NoF, SSD offload, copies,
/// moves and tasks between Mooncake stores, admin queries).
pub const UNSERVED: &[&str] = &[
    "BatchQueryIp",
    "BatchReplicaClear",
    "MountNoFSegment",
    "ReMountNoFSegment",
    "UnmountNoFSegment",
    "GetAllNoFSegments",
    "GetNoFSegmentsByName",
    "QuerySegmentStatus",
    "QuerySegmentStatusById",
    "MountLocalDiskSegment",
    "UnmountLocalDiskSegment",
    "OffloadObjectHeartbeat",
    "ReportSsdCapacity",
    "NotifyOffloadSuccess",
    "PromotionObjectHeartbeat",
    "PromotionAllocStart",
    "NotifyPromotionSuccess",
    "NotifyPromotionFailure",
    "CopyStart",
    "DynamicReplicaCopyStart",
    "CopyEnd",
    "DynamicReplicaCopyEnd",
    "CopyRevoke",
    "DynamicReplicaCopyRevoke",
    "MoveStart",
    "MoveEnd",
    "MoveRevoke",
    "EvictDiskReplica",
    "BatchEvictDiskReplica",
    "PollRemoveAll",
    "CreateCopyTask",
    "CreateMoveTask",
    "QueryTask",
];

/// What a function id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    Served(Rpc),
    /// Registered by Mooncake, not served here: its name.
    Unserved(&'static str),
}

impl Rpc {
    /// The coro_rpc function id of this RPC.
    pub fn id(self) -> u32 {
        function_id(&format!("{SERVICE}{}", self.name()))
    }
}

/// The handler a function id names, if Mooncake registers one under it.
pub fn handler(id: u32) -> Option<Handler> {
    static TABLE: OnceLock<HashMap<u32, Handler>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            let served = Rpc::ALL.iter().map(|&r| (r.id(), Handler::Served(r)));
            let unserved = UNSERVED
                .iter()
                .map(|&n| (function_id(&format!("{SERVICE}{n}")), Handler::Unserved(n)));
            served.chain(unserved).collect()
        })
        .get(&id)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_handler_mooncake_registers_is_known_by_its_id() {
        // Ids of the 64 handlers the 0.3.13.post1 wheel's master registers (reference table).
        let known = [
            (Rpc::ServiceReady, 0x7b81_bb56),
            (Rpc::GetStorageConfig, 0x8da9_b0a6),
            (Rpc::MountSegment, 0x3e7e_c4bb),
            (Rpc::ReMountSegment, 0x0b05_3b72),
            (Rpc::Ping, 0xd6c2_dae5),
            (Rpc::FetchTasks, 0xdf14_1844),
            (Rpc::PutStart, 0x65ea_9ac1),
            (Rpc::BatchPutEnd, 0x80e0_20ab),
            (Rpc::RemoveAll, 0xd978_ceb0),
            (Rpc::BatchUpsertRevoke, 0x9093_ae79),
        ];
        for (rpc, id) in known {
            assert_eq!(rpc.id(), id, "{}", rpc.name());
            assert_eq!(handler(id), Some(Handler::Served(rpc)));
        }
        assert_eq!(
            handler(0x74d1_e980),
            Some(Handler::Unserved("BatchEvictDiskReplica"))
        );
        assert_eq!(
            Rpc::ALL.len() + UNSERVED.len(),
            64,
            "all Mooncake registers"
        );
        assert_eq!(handler(0x1234_5678), None);
    }
}
