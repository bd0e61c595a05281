//! Each request of the binary protocol bound to its opcode and the reply it gets, declared once
//! here: a caller names the RPC (`conn.call::<rpc::PutStart>(&req)`) and gets its reply type,
//! a server decodes the request and answers through the same declaration
//! ([`Rpc::request`], `ServerIo::answer`), so a request sent with the wrong opcode, or
//! answered or read back as the wrong type, does not compile.
//!
//! The data requests that carry a payload (`WRITE`, `WRITE_CHECKED`, `READ`, `READ_VERSION`)
//! go through `transfer::stream` with their bytes and are not here.

use super::message::*;
use super::{Opcode, TransferError, Wire};

/// A request of the protocol: its opcode, what its meta holds and what the answer's meta holds.
pub trait Rpc {
    const OPCODE: Opcode;
    type Request: Wire;
    type Reply: Wire;

    /// The request in a frame's meta.
    fn request(meta: &[u8]) -> Result<Self::Request, TransferError> {
        Self::Request::from_meta(meta)
    }
}

/// One marker type per opcode, named as the opcode, with its request and reply.
macro_rules! rpcs {
    ($($(#[$m:meta])* $name:ident : $req:ty => $reply:ty;)*) => {
        $(
            $(#[$m])*
            #[derive(Clone, Copy, Debug)]
            pub struct $name;
            impl Rpc for $name {
                const OPCODE: Opcode = Opcode::$name;
                type Request = $req;
                type Reply = $reply;
            }
        )*
        /// Every opcode declared here.
        #[cfg(test)]
        const DECLARED: &[Opcode] = &[$(Opcode::$name),*];
    };
}

rpcs! {
    // The secret's handshake (`crate::auth`), first on a connection to any server.
    AuthHello: AuthHelloReq => AuthChallengeResp;
    AuthProof: AuthProofReq => ();

    // Clients and stores to the master.
    Ping: PingReq => PingResp;
    Leave: PingReq => ();
    MountSegment: MountReq => MountResp;
    UnmountSegment: UnmountReq => ();
    ListSegments: () => ListSegmentsResp;
    ReportObjects: ReportReq => ReportResp;
    Lease: LeaseReq => LeaseResp;
    HandOver: HandOverReq => HandOverResp;
    ObjectsHashed: HashedReq => ();
    ReportCorrupt: ReportCorruptReq => ();
    PutStart: PutStartReq => PutStartResp;
    PutEnd: PutEndReq => ();
    PutRevoke: PutRevokeReq => ();
    GetReplicas: KeyReq => ObjectDesc;
    Exists: KeyReq => bool;
    Remove: RemoveReq => ();
    RemoveAll: RemoveAllReq => RemoveAllResp;
    ListKeys: ListKeysReq => ListKeysResp;
    BatchPutStart: BatchPutStartReq => BatchPutStartResp;
    BatchPutEnd: BatchPutEndReq => BatchStatusResp;
    BatchPutRevoke: BatchPutEndReq => BatchStatusResp;
    BatchPutCommit: BatchPutCommitReq => BatchPutCommitResp;
    BatchGetReplicas: BatchKeysReq => BatchGetReplicasResp;
    BatchExists: BatchKeysReq => BatchExistsResp;
    BatchRemove: BatchRemoveReq => BatchStatusResp;

    // To a store.
    StoreInfo: () => StoreInfoResp;
    Seal: SealReq => BatchStatusResp;
    SealChecked: SealReq => BatchStatusResp;
    SealDeferred: SealReq => SealDeferredResp;
    CheckVersion: ReadVersionReq => CheckVersionResp;
    RdmaConnect: RdmaConnectReq => RdmaConnectResp;

    // The master's orders to a store, sent with `Connection::order` (its grant key around the
    // request).
    Forget: ForgetReq => ();
    ForgetLease: ForgetLeaseReq => ();
    Move: MoveReq => BatchStatusResp;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_without_a_payload_is_declared_once() {
        let with_payload = [
            Opcode::Write,
            Opcode::WriteChecked,
            Opcode::Read,
            Opcode::ReadVersion,
        ];
        for op in Opcode::ALL {
            let n = DECLARED.iter().filter(|d| **d == op).count();
            let want = usize::from(!with_payload.contains(&op));
            assert_eq!(n, want, "{} declared {n} times", op.name());
        }
    }
}
