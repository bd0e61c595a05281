//! The types Mooncake's master RPC carries (field lists in wire order, from Mooncake's
//! `types.h`, `replica.h`, `allocator.h` and `rpc_types.h` as the 0.3.13.post1 wheel has them),
//! and its error codes.

use super::struct_pack::{lit, Pack, Reader, SpError, Writer};
use crate::sp_struct;

/// Mooncake's `UUID`: a `std::pair<uint64_t, uint64_t>`, trivially serializable, so it travels
/// as 16 raw bytes and its literal carries the pair's packing and alignment (8 and 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid(pub u64, pub u64);

impl std::fmt::Display for Uuid {
    /// As Mooncake logs it: both halves in decimal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Size literal of 8 (`n + 129` for n < 127): the pair's packing and alignment.
const ALIGN_8: u8 = 8 + 129;

impl Pack for Uuid {
    fn literal(out: &mut Vec<u8>) {
        out.extend_from_slice(&[lit::STRUCT, lit::U64, lit::U64, ALIGN_8, ALIGN_8, lit::END]);
    }
    fn pack(&self, w: &mut Writer) {
        w.raw(&self.0.to_le_bytes());
        w.raw(&self.1.to_le_bytes());
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        Ok(Uuid(u64::unpack(r)?, u64::unpack(r)?))
    }
}

sp_struct!(
    /// A segment of memory a client contributes (`Segment`): `base` is an address in the
    /// owner's process, `te_endpoint` the Transfer Engine name its data is reached by.
    pub struct Segment {
        pub id: Uuid,
        pub name: String,
        pub base: u64,
        pub size: u64,
        pub te_endpoint: String,
        pub protocol: String,
        pub host_id: String,
    }
);

/// `SoftPinAction` (`u8`).
pub mod soft_pin {
    pub const PRESERVE: u8 = 0;
    pub const ENABLE: u8 = 1;
    pub const DISABLE: u8 = 2;
}

sp_struct!(
    /// How a put is placed (`ReplicateConfig`, an aggregate: declaration order).
    pub struct ReplicateConfig {
        pub replica_num: u64,
        pub nof_replica_num: u64,
        pub dfs_replica_num: u64,
        pub soft_pin_action: u8,
        pub soft_pin_ttl_ms: Option<u64>,
        pub with_hard_pin: bool,
        pub preferred_segments: Vec<String>,
        pub preferred_segment: String,
        pub preferred_nof_segments: Vec<String>,
        pub prefer_alloc_in_same_node: bool,
        pub data_type: u8,
        pub host_id: String,
        pub group_ids: Option<Vec<String>>,
    }
);

sp_struct!(
    /// A put's key and, optionally, the value's checksum (`ObjectMeta`).
    pub struct ObjectMeta {
        pub key: String,
        pub object_checksum: Option<u64>,
    }
);

sp_struct!(
    /// Where a replica's bytes are (`AllocatedBuffer::Descriptor`): an address in the segment
    /// owner's process and the Transfer Engine endpoint to reach it by.
    pub struct BufferDescriptor {
        pub size: u64,
        pub buffer_address: u64,
        pub protocol: String,
        pub transport_endpoint: String,
    }
);

sp_struct!(
    /// `DiskDescriptor`.
    pub struct DiskDescriptor {
        pub file_path: String,
        pub object_size: u64,
    }
);

sp_struct!(
    /// `LocalDiskDescriptor`.
    pub struct LocalDiskDescriptor {
        pub client_id: Uuid,
        pub object_size: u64,
        pub transport_endpoint: String,
    }
);

sp_struct!(
    /// `DistributedFSDescriptor`.
    pub struct DfsDescriptor {
        pub file_path: String,
        pub offset: u64,
        pub object_size: u64,
        pub aligned_size: u64,
        pub shard_idx: i32,
    }
);

/// Where a replica lives (`Replica::Descriptor::descriptor_variant`). rbgctl hands out memory
/// replicas only; the others are read so that a message holding one is understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    Memory(BufferDescriptor),
    Nof(BufferDescriptor),
    Disk(DiskDescriptor),
    LocalDisk(LocalDiskDescriptor),
    Dfs(DfsDescriptor),
}

impl Default for Placement {
    fn default() -> Self {
        Placement::Memory(BufferDescriptor::default())
    }
}

/// `MemoryDescriptor` and `NoFDescriptor` wrap the buffer descriptor in a struct of one field.
fn wrapped_buffer_literal(out: &mut Vec<u8>) {
    out.push(lit::STRUCT);
    BufferDescriptor::literal(out);
    out.push(lit::END);
}

impl Pack for Placement {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::VARIANT);
        wrapped_buffer_literal(out);
        wrapped_buffer_literal(out);
        DiskDescriptor::literal(out);
        LocalDiskDescriptor::literal(out);
        DfsDescriptor::literal(out);
        out.push(lit::END);
    }
    fn max_len(&self) -> usize {
        match self {
            Placement::Memory(b) | Placement::Nof(b) => b.max_len(),
            Placement::Disk(d) => d.max_len(),
            Placement::LocalDisk(d) => d.max_len(),
            Placement::Dfs(d) => d.max_len(),
        }
    }
    fn pack(&self, w: &mut Writer) {
        match self {
            Placement::Memory(b) => {
                w.raw(&[0]);
                b.pack(w);
            }
            Placement::Nof(b) => {
                w.raw(&[1]);
                b.pack(w);
            }
            Placement::Disk(d) => {
                w.raw(&[2]);
                d.pack(w);
            }
            Placement::LocalDisk(d) => {
                w.raw(&[3]);
                d.pack(w);
            }
            Placement::Dfs(d) => {
                w.raw(&[4]);
                d.pack(w);
            }
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        Ok(match r.tag("variant", 5)? {
            0 => Placement::Memory(BufferDescriptor::unpack(r)?),
            1 => Placement::Nof(BufferDescriptor::unpack(r)?),
            2 => Placement::Disk(DiskDescriptor::unpack(r)?),
            3 => Placement::LocalDisk(LocalDiskDescriptor::unpack(r)?),
            _ => Placement::Dfs(DfsDescriptor::unpack(r)?),
        })
    }
}

/// `ReplicaStatus` (i32).
pub mod replica_status {
    pub const PROCESSING: i32 = 2;
    pub const COMPLETE: i32 = 3;
}

sp_struct!(
    /// One replica (`Replica::Descriptor`).
    pub struct ReplicaDescriptor {
        pub id: u64,
        pub placement: Placement,
        pub status: i32,
    }
);

sp_struct!(
    /// `GetReplicaListResponse`.
    pub struct GetReplicaListResponse {
        pub replicas: Vec<ReplicaDescriptor>,
        pub lease_ttl_ms: u64,
        pub object_checksum: Option<u64>,
    }
);

/// `ClientStatus` (i32).
pub mod client_status {
    pub const OK: i32 = 1;
    pub const NEED_REMOUNT: i32 = 2;
}

sp_struct!(
    /// `PingResponse`.
    pub struct PingResponse {
        pub view_version_id: i64,
        pub client_status: i32,
    }
);

sp_struct!(
    /// `GetStorageConfigResponse`: `{"", true, 0}` says the master keeps no files.
    pub struct GetStorageConfigResponse {
        pub fsdir: String,
        pub enable_disk_eviction: bool,
        pub quota_bytes: u64,
    }
);

sp_struct!(
    /// `TaskAssignment` (rbgctl hands out none).
    pub struct TaskAssignment {
        pub id: Uuid,
        pub task_type: i32,
        pub payload: String,
        pub created_at_ms_epoch: i64,
        pub max_retry_attempts: u32,
    }
);

sp_struct!(
    /// `TaskCompleteRequest`.
    pub struct TaskCompleteRequest {
        pub id: Uuid,
        pub status: i32,
        pub message: String,
    }
);

/// `ReplicaType` (i32): what PutEnd and PutRevoke name (`ALL` from the wheel).
pub mod replica_type {
    pub const MEMORY: i32 = 0;
    pub const ALL: i32 = 4;
}

/// Mooncake's `ErrorCode` values that rbgctl answers with (`types.h`).
pub mod error_code {
    pub const INTERNAL_ERROR: i32 = -1;
    pub const SEGMENT_NOT_FOUND: i32 = -101;
    pub const SEGMENT_ALREADY_EXISTS: i32 = -102;
    pub const CLIENT_NOT_FOUND: i32 = -103;
    pub const NO_AVAILABLE_HANDLE: i32 = -200;
    pub const INVALID_VERSION: i32 = -300;
    pub const INVALID_KEY: i32 = -400;
    pub const INVALID_PARAMS: i32 = -600;
    pub const ILLEGAL_CLIENT: i32 = -601;
    pub const INVALID_WRITE: i32 = -700;
    pub const TRANSFER_FAIL: i32 = -800;
    pub const REPLICA_IS_NOT_READY: i32 = -703;
    pub const OBJECT_NOT_FOUND: i32 = -704;
    pub const OBJECT_ALREADY_EXISTS: i32 = -705;
    pub const OBJECT_HAS_LEASE: i32 = -706;
    pub const CHECKSUM_MISMATCH: i32 = -801;
    pub const UNAVAILABLE_IN_CURRENT_STATUS: i32 = -1010;
    pub const NOT_SUPPORTED: i32 = -1012;
    pub const TENANT_QUOTA_EXCEEDED: i32 = -1700;
    pub const TENANT_NOT_REGISTERED: i32 = -1701;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mooncake::struct_pack::TypeSig;

    fn literal<T: Pack>() -> String {
        TypeSig::of::<T>()
            .literal
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_types_spell_the_literals_the_wheel_sends() {
        // From the reference's table of what the 0.3.13.post1 wheel sends and expects.
        assert_eq!(literal::<Uuid>(), "fd 04 04 89 89 ff");
        assert_eq!(
            literal::<(Segment, Uuid)>(),
            "fd fd fd 04 04 89 89 ff 80 0c 04 04 80 0c 80 0c 80 0c ff fd 04 04 89 89 ff ff"
        );
        assert_eq!(
            literal::<(Uuid, String, u64, ReplicateConfig, String)>(),
            "fd fd 04 04 89 89 ff 80 0c 04 fd 04 04 04 06 85 04 0b 84 80 0c 80 0c 84 80 0c 0b \
             06 80 0c 85 84 80 0c ff 80 0c ff"
        );
        assert_eq!(
            literal::<Result<GetReplicaListResponse, i32>>(),
            "87 fd 84 fd 04 86 fd fd 04 04 80 0c 80 0c ff ff fd fd 04 04 80 0c 80 0c ff ff fd \
             80 0c 04 ff fd fd 04 04 89 89 ff 04 80 0c ff fd 80 0c 04 04 04 01 ff ff 01 ff 04 85 \
             04 ff 01"
        );
        assert_eq!(literal::<Result<PingResponse, i32>>(), "87 fd 03 01 ff 01");
        assert_eq!(
            literal::<Result<Vec<TaskAssignment>, i32>>(),
            "87 84 fd fd 04 04 89 89 ff 01 80 0c 03 02 ff 01"
        );
        assert_eq!(
            literal::<(Uuid, ObjectMeta, i32, String)>(),
            "fd fd 04 04 89 89 ff fd 80 0c 85 04 ff 01 80 0c ff"
        );
        assert_eq!(literal::<Vec<Result<bool, i32>>>(), "84 87 0b 01");
        use crate::mooncake::struct_pack::Map;
        assert_eq!(
            literal::<Result<Map<String, Vec<ReplicaDescriptor>>, i32>>(),
            "87 82 80 0c 84 fd 04 86 fd fd 04 04 80 0c 80 0c ff ff fd fd 04 04 80 0c 80 0c ff ff \
             fd 80 0c 04 ff fd fd 04 04 89 89 ff 04 80 0c ff fd 80 0c 04 04 04 01 ff ff 01 ff 01"
        );
        assert_eq!(
            literal::<(Uuid, Vec<String>, Vec<u64>, ReplicateConfig, String)>(),
            "fd fd 04 04 89 89 ff 84 80 0c 84 04 fd 04 04 04 06 85 04 0b 84 80 0c 80 0c 84 80 0c \
             0b 06 80 0c 85 84 80 0c ff 80 0c ff"
        );
        assert_eq!(
            literal::<Vec<Result<Vec<ReplicaDescriptor>, i32>>>(),
            "84 87 84 fd 04 86 fd fd 04 04 80 0c 80 0c ff ff fd fd 04 04 80 0c 80 0c ff ff fd 80 \
             0c 04 ff fd fd 04 04 89 89 ff 04 80 0c ff fd 80 0c 04 04 04 01 ff ff 01 ff 01"
        );
        assert_eq!(literal::<Result<(), i32>>(), "87 fa 01");
    }
}
