//! libibverbs, loaded when RDMA is first used (`dlopen("libibverbs.so.1")`, as NCCL and UCX do):
//! one binary serves every role whether or not the machine has rdma-core, and a build needs no
//! RDMA headers. The few structures the data path touches are declared here with the layout of
//! rdma-core's `<infiniband/verbs.h>` (stable ABI since libibverbs 1.1); `abi_facts` lists their
//! sizes, offsets and constants, and `tests/it/rdma.rs` compares them with the system's headers.
//!
//! Above the raw calls, owned handles that free what they hold when dropped, in the order the
//! verbs require (a queue pair before its completion queue, memory regions before their
//! protection domain, everything before the device context): each holds an `Arc` of what it
//! was made from.
//!
//! The `ibverbs` crate (0.9.2) was the first choice; it registers only memory it allocates itself,
//! posts only SEND, ties every object to a borrowed context, and its `ibverbs-sys` builds all of
//! rdma-core with cmake and bindgen (and fails to find its own headers with the current `cmake`
//! crate). What is here is the part of it this data path needs, without the build.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::{Arc, OnceLock};

/// An error from the verbs library, naming the call that failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error(
        "cannot load libibverbs.so.1 ({0}): install rdma-core's user libraries (Debian: \
         ibverbs-providers, which brings libibverbs1) or use protocol = \"tcp\""
    )]
    Library(String),
    #[error("{call} failed: {source}")]
    Call {
        call: &'static str,
        source: std::io::Error,
    },
    #[error("{0}")]
    Device(String),
    /// The kernel lists no RDMA devices at all.
    #[error("this host's kernel offers no RDMA devices ({0}); load its RDMA drivers (ib_uverbs and the NIC's; for soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE)")]
    NoRdma(std::io::Error),
}

impl VerbsError {
    fn call(call: &'static str) -> VerbsError {
        VerbsError::Call {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    fn errno(call: &'static str, rc: c_int) -> VerbsError {
        VerbsError::Call {
            call,
            source: std::io::Error::from_raw_os_error(rc),
        }
    }
}

// ---- The ABI (rdma-core's verbs.h) ----

/// `IBV_QPS_INIT`: a queue pair given its port and access flags.
pub const QPS_INIT: u32 = 1;
/// `IBV_QPS_RTR`: ready to receive, connected to its peer.
pub const QPS_RTR: u32 = 2;
/// `IBV_QPS_RTS`: ready to send.
pub const QPS_RTS: u32 = 3;
/// `IBV_QPS_ERR`: failed; its outstanding requests complete flushed.
pub const QPS_ERR: u32 = 6;

/// `IBV_QP_STATE` of `enum ibv_qp_attr_mask`: the attribute mask bits below say which
/// fields of an `IbvQpAttr` a `modify_qp` sets.
pub const QP_STATE: c_int = 1;
/// `IBV_QP_ACCESS_FLAGS`.
pub const QP_ACCESS_FLAGS: c_int = 8;
/// `IBV_QP_PKEY_INDEX`.
pub const QP_PKEY_INDEX: c_int = 16;
/// `IBV_QP_PORT`.
pub const QP_PORT: c_int = 32;
/// `IBV_QP_AV` (the address vector, `ah_attr`).
pub const QP_AV: c_int = 128;
/// `IBV_QP_PATH_MTU`.
pub const QP_PATH_MTU: c_int = 256;
/// `IBV_QP_TIMEOUT`.
pub const QP_TIMEOUT: c_int = 512;
/// `IBV_QP_RETRY_CNT`.
pub const QP_RETRY_CNT: c_int = 1024;
/// `IBV_QP_RNR_RETRY`.
pub const QP_RNR_RETRY: c_int = 2048;
/// `IBV_QP_RQ_PSN`.
pub const QP_RQ_PSN: c_int = 4096;
/// `IBV_QP_MAX_QP_RD_ATOMIC`.
pub const QP_MAX_QP_RD_ATOMIC: c_int = 8192;
/// `IBV_QP_MIN_RNR_TIMER`.
pub const QP_MIN_RNR_TIMER: c_int = 32768;
/// `IBV_QP_SQ_PSN`.
pub const QP_SQ_PSN: c_int = 65536;
/// `IBV_QP_MAX_DEST_RD_ATOMIC`.
pub const QP_MAX_DEST_RD_ATOMIC: c_int = 131072;
/// `IBV_QP_DEST_QPN`.
pub const QP_DEST_QPN: c_int = 1048576;

/// `IBV_ACCESS_LOCAL_WRITE`: the NIC may write the region (receives, READ results).
pub const ACCESS_LOCAL_WRITE: c_int = 1;
/// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into the region.
pub const ACCESS_REMOTE_WRITE: c_int = 2;
/// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from the region.
pub const ACCESS_REMOTE_READ: c_int = 4;

/// `IBV_WR_RDMA_WRITE`, a work request's opcode.
pub const WR_RDMA_WRITE: u32 = 0;
/// `IBV_WR_RDMA_READ`.
pub const WR_RDMA_READ: u32 = 4;
/// `IBV_SEND_SIGNALED`: the work request completes with a work completion.
pub const SEND_SIGNALED: u32 = 2;

/// `IBV_WC_SUCCESS`, a work completion's status.
pub const WC_SUCCESS: u32 = 0;
/// `IBV_WC_WR_FLUSH_ERR`: flushed when its queue pair failed.
pub const WC_WR_FLUSH_ERR: u32 = 5;

/// `IBV_PORT_ACTIVE`, a port's state.
pub const PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_ETHERNET`: RoCE (addressed by GID, not LID).
pub const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_QPT_RC`: a reliable connected queue pair.
pub const QPT_RC: u32 = 2;

/// `struct ibv_device`, only ever behind a pointer.
#[repr(C)]
pub struct IbvDevice {
    _opaque: [u8; 0],
}

/// `struct ibv_context`, as far as its operations table: `ops` is `struct ibv_context_ops`, 32
/// function pointers, of which the data path calls `poll_cq` and `post_send`.
#[repr(C)]
pub struct IbvContext {
    device: *mut IbvDevice,
    ops: [*const c_void; 32],
}
const OPS_POLL_CQ: usize = 11;
const OPS_POST_SEND: usize = 25;

/// `struct ibv_pd`, a protection domain, only ever behind a pointer.
#[repr(C)]
pub struct IbvPd {
    _opaque: [u8; 0],
}

/// `struct ibv_cq`, a completion queue, only ever behind a pointer.
#[repr(C)]
pub struct IbvCq {
    _opaque: [u8; 0],
}

/// `struct ibv_mr`, as far as its keys: a registered memory region.
#[repr(C)]
pub struct IbvMr {
    context: *mut IbvContext,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// `struct ibv_qp` as far as `qp_num`.
#[repr(C)]
pub struct IbvQp {
    context: *mut IbvContext,
    qp_context: *mut c_void,
    pd: *mut IbvPd,
    send_cq: *mut IbvCq,
    recv_cq: *mut IbvCq,
    srq: *mut c_void,
    handle: u32,
    qp_num: u32,
}

/// `struct ibv_sge`: one piece of local memory a work request moves (address, length,
/// the region's local key).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` with the `rdma` member of its `wr` union spelt out (the others are
/// padding here: this path posts only RDMA READ and WRITE).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: u32,
    _bind_mw_or_tso: [u64; 6],
}

impl Default for IbvSendWr {
    fn default() -> Self {
        IbvSendWr {
            wr_id: 0,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _qp_type: 0,
            _bind_mw_or_tso: [0; 6],
        }
    }
}

/// `struct ibv_wc`: a work completion, as `poll_cq` fills it.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`: a queue pair's outstanding requests and pieces per request.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`: what `ibv_create_qp` makes.
#[repr(C)]
pub struct IbvQpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut IbvCq,
    recv_cq: *mut IbvCq,
    srq: *mut c_void,
    cap: IbvQpCap,
    qp_type: u32,
    sq_sig_all: c_int,
}

/// `union ibv_gid`: 16 bytes, aligned as its two `__be64` halves.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct IbvGid(pub [u8; 16]);

/// `struct ibv_global_route`: the GID route a RoCE address vector needs.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    dgid: IbvGid,
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

/// `struct ibv_ah_attr`: the address vector of a connected queue pair's peer.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    grh: IbvGlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
}

/// `struct ibv_qp_attr`: the attributes `ibv_modify_qp` sets, those its mask names.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: c_int,
    cap: IbvQpCap,
    ah_attr: IbvAhAttr,
    alt_ah_attr: IbvAhAttr,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

/// `struct ibv_port_attr` as far as `port_cap_flags2`, then room for what newer libraries add.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    _newer: [u8; 80],
}

/// Sizes, field offsets and constants this module assumes, by their C names: the ABI check in
/// `tests/it/rdma.rs` prints the same from the system's `<infiniband/verbs.h>` and compares.
pub fn abi_facts() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        ("sizeof(struct ibv_wc)", size_of::<IbvWc>()),
        ("sizeof(struct ibv_sge)", size_of::<IbvSge>()),
        ("sizeof(struct ibv_send_wr)", size_of::<IbvSendWr>()),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(IbvSendWr, remote_addr),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(IbvSendWr, rkey),
        ),
        (
            "sizeof(struct ibv_qp_init_attr)",
            size_of::<IbvQpInitAttr>(),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            offset_of!(IbvQpInitAttr, qp_type),
        ),
        ("offsetof(struct ibv_qp, qp_num)", offset_of!(IbvQp, qp_num)),
        ("offsetof(struct ibv_mr, lkey)", offset_of!(IbvMr, lkey)),
        ("offsetof(struct ibv_mr, rkey)", offset_of!(IbvMr, rkey)),
        ("sizeof(struct ibv_qp_attr)", size_of::<IbvQpAttr>()),
        (
            "offsetof(struct ibv_qp_attr, ah_attr)",
            offset_of!(IbvQpAttr, ah_attr),
        ),
        (
            "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
            offset_of!(IbvQpAttr, max_dest_rd_atomic),
        ),
        (
            "offsetof(struct ibv_qp_attr, rnr_retry)",
            offset_of!(IbvQpAttr, rnr_retry),
        ),
        (
            "offsetof(struct ibv_qp_attr, rate_limit)",
            offset_of!(IbvQpAttr, rate_limit),
        ),
        ("sizeof(struct ibv_ah_attr)", size_of::<IbvAhAttr>()),
        (
            "offsetof(struct ibv_ah_attr, is_global)",
            offset_of!(IbvAhAttr, is_global),
        ),
        (
            "offsetof(struct ibv_ah_attr, port_num)",
            offset_of!(IbvAhAttr, port_num),
        ),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            offset_of!(IbvPortAttr, active_mtu),
        ),
        (
            "offsetof(struct ibv_port_attr, lid)",
            offset_of!(IbvPortAttr, lid),
        ),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            offset_of!(IbvPortAttr, link_layer),
        ),
        (
            "offsetof(struct ibv_context, ops.poll_cq)",
            offset_of!(IbvContext, ops) + OPS_POLL_CQ * size_of::<*const c_void>(),
        ),
        (
            "offsetof(struct ibv_context, ops.post_send)",
            offset_of!(IbvContext, ops) + OPS_POST_SEND * size_of::<*const c_void>(),
        ),
        ("IBV_QPS_INIT", QPS_INIT as usize),
        ("IBV_QPS_RTR", QPS_RTR as usize),
        ("IBV_QPS_RTS", QPS_RTS as usize),
        ("IBV_QPS_ERR", QPS_ERR as usize),
        ("IBV_QP_STATE", QP_STATE as usize),
        ("IBV_QP_ACCESS_FLAGS", QP_ACCESS_FLAGS as usize),
        ("IBV_QP_PKEY_INDEX", QP_PKEY_INDEX as usize),
        ("IBV_QP_PORT", QP_PORT as usize),
        ("IBV_QP_AV", QP_AV as usize),
        ("IBV_QP_PATH_MTU", QP_PATH_MTU as usize),
        ("IBV_QP_TIMEOUT", QP_TIMEOUT as usize),
        ("IBV_QP_RETRY_CNT", QP_RETRY_CNT as usize),
        ("IBV_QP_RNR_RETRY", QP_RNR_RETRY as usize),
        ("IBV_QP_RQ_PSN", QP_RQ_PSN as usize),
        ("IBV_QP_MAX_QP_RD_ATOMIC", QP_MAX_QP_RD_ATOMIC as usize),
        ("IBV_QP_MIN_RNR_TIMER", QP_MIN_RNR_TIMER as usize),
        ("IBV_QP_SQ_PSN", QP_SQ_PSN as usize),
        ("IBV_QP_MAX_DEST_RD_ATOMIC", QP_MAX_DEST_RD_ATOMIC as usize),
        ("IBV_QP_DEST_QPN", QP_DEST_QPN as usize),
        ("IBV_ACCESS_LOCAL_WRITE", ACCESS_LOCAL_WRITE as usize),
        ("IBV_ACCESS_REMOTE_WRITE", ACCESS_REMOTE_WRITE as usize),
        ("IBV_ACCESS_REMOTE_READ", ACCESS_REMOTE_READ as usize),
        ("IBV_WR_RDMA_WRITE", WR_RDMA_WRITE as usize),
        ("IBV_WR_RDMA_READ", WR_RDMA_READ as usize),
        ("IBV_SEND_SIGNALED", SEND_SIGNALED as usize),
        ("IBV_WC_SUCCESS", WC_SUCCESS as usize),
        ("IBV_WC_WR_FLUSH_ERR", WC_WR_FLUSH_ERR as usize),
        ("IBV_PORT_ACTIVE", PORT_ACTIVE as usize),
        ("IBV_LINK_LAYER_ETHERNET", LINK_LAYER_ETHERNET as usize),
        ("IBV_QPT_RC", QPT_RC as usize),
    ]
}

// ---- The library ----

type PostSendFn = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PollCqFn = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;

/// The entry points, resolved once.
struct Fns {
    get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice,
    free_device_list: unsafe extern "C" fn(*mut *mut IbvDevice),
    get_device_name: unsafe extern "C" fn(*mut IbvDevice) -> *const c_char,
    open_device: unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext,
    close_device: unsafe extern "C" fn(*mut IbvContext) -> c_int,
    query_port: unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int,
    query_gid: unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int,
    alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd,
    dealloc_pd: unsafe extern "C" fn(*mut IbvPd) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr,
    dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    create_cq:
        unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut IbvCq,
    destroy_cq: unsafe extern "C" fn(*mut IbvCq) -> c_int,
    create_qp: unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp,
    modify_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut IbvQp) -> c_int,
    wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
}

struct Lib {
    fns: Fns,
    /// Kept loaded for the life of the process (the pointers above point into it).
    _lib: libloading::Library,
}

fn lib() -> Result<&'static Fns, VerbsError> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| load().map_err(|e| e.to_string()))
        .as_ref()
        .map(|l| &l.fns)
        .map_err(|e| VerbsError::Library(e.clone()))
}

fn load() -> Result<Lib, libloading::Error> {
    // SAFETY: loading rdma-core's libibverbs runs its constructors, which only set up its own
    // state; each symbol below is given the C signature verbs.h declares for it.
    unsafe {
        let lib = libloading::Library::new("libibverbs.so.1")?;
        macro_rules! sym {
            ($name:literal) => {
                *lib.get(concat!($name, "\0").as_bytes())?
            };
        }
        let fns = Fns {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            wc_status_str: sym!("ibv_wc_status_str"),
        };
        Ok(Lib { fns, _lib: lib })
    }
}

/// Whether libibverbs can be loaded here (for messages and tests).
pub fn available() -> Result<(), VerbsError> {
    lib().map(|_| ())
}

/// The RDMA devices this host has, by name (`rxe0`, `mlx5_0`).
pub fn device_names() -> Result<Vec<String>, VerbsError> {
    with_devices(|_, devices| Ok(devices.iter().map(|(_, name)| name.clone()).collect()))
}

/// Runs `f` on this host's RDMA devices (each with its name); the list is freed after, so a
/// device pointer must not outlive `f`. No list at all is the kernel saying it has no RDMA.
fn with_devices<T>(
    f: impl FnOnce(&Fns, &[(*mut IbvDevice, String)]) -> Result<T, VerbsError>,
) -> Result<T, VerbsError> {
    let fns = lib()?;
    let mut n: c_int = 0;
    // SAFETY: the list is read while it lives and freed once `f` is done with it.
    unsafe {
        let list = (fns.get_device_list)(&mut n);
        if list.is_null() {
            return Err(VerbsError::NoRdma(std::io::Error::last_os_error()));
        }
        let devices: Vec<(*mut IbvDevice, String)> = (0..n.max(0) as usize)
            .map(|i| {
                let dev = *list.add(i);
                let name = CStr::from_ptr((fns.get_device_name)(dev)).to_string_lossy();
                (dev, name.into_owned())
            })
            .collect();
        let result = f(fns, &devices);
        (fns.free_device_list)(list);
        result
    }
}

/// What a work completion's status means, in libibverbs' words.
pub fn wc_status_text(status: u32) -> String {
    match lib() {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        Ok(f) => unsafe { CStr::from_ptr((f.wc_status_str)(status)) }
            .to_string_lossy()
            .into_owned(),
        Err(_) => format!("status {status}"),
    }
}

// ---- Owned handles ----

/// An open device (`ibv_open_device`).
pub struct Context {
    raw: *mut IbvContext,
    name: String,
}

// SAFETY: verbs objects may be used from any thread (libibverbs locks what it shares).
unsafe impl Send for Context {}
// SAFETY: as for `Send`; the device is closed only in `Drop`.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the RDMA device named `name` (`rxe0`, `mlx5_0`); the error lists the devices there
    /// are.
    pub fn open(name: &str) -> Result<Arc<Context>, VerbsError> {
        let opened = with_devices(|fns, devices| {
            let Some((dev, _)) = devices.iter().find(|(_, n)| n == name) else {
                let names: Vec<&str> = devices.iter().map(|(_, n)| n.as_str()).collect();
                return Err(VerbsError::Device(if names.is_empty() {
                    format!(
                        "no RDMA device {name:?}: this host has none (load a driver, or for \
                         soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE)"
                    )
                } else {
                    format!(
                        "no RDMA device {name:?}; this host has {}",
                        names.join(", ")
                    )
                }));
            };
            // SAFETY: the device is in the live list; the context does not need the list.
            let raw = unsafe { (fns.open_device)(*dev) };
            if raw.is_null() {
                return Err(VerbsError::call("ibv_open_device"));
            }
            Ok(Arc::new(Context {
                raw,
                name: name.to_string(),
            }))
        });
        opened.map_err(|e| match e {
            VerbsError::NoRdma(_) => VerbsError::Device(format!("no RDMA device {name:?}: {e}")),
            e => e,
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The state, MTU and LID of the device's port `port`.
    pub fn query_port(&self, port: u8) -> Result<IbvPortAttr, VerbsError> {
        let f = lib()?;
        // SAFETY: zeroed is a valid IbvPortAttr (plain integers); the library fills at most the
        // struct it knows, which this one's tail has room beyond.
        let mut attr: IbvPortAttr = unsafe { std::mem::zeroed() };
        let rc = unsafe { (f.query_port)(self.raw, port, &mut attr) };
        if rc != 0 {
            return Err(VerbsError::errno("ibv_query_port", rc));
        }
        Ok(attr)
    }

    /// The GID at `index` of port `port` (RoCE addresses its peers by GID).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<IbvGid, VerbsError> {
        let f = lib()?;
        let mut gid = IbvGid::default();
        // SAFETY: gid is a 16-byte out parameter.
        let rc = unsafe { (f.query_gid)(self.raw, port, index as c_int, &mut gid) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_query_gid"));
        }
        Ok(gid)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Ok(f) = lib() {
            // SAFETY: every object made from this context holds an Arc of it, so none is left.
            unsafe { (f.close_device)(self.raw) };
        }
    }
}

/// A protection domain: memory regions and queue pairs that may work together.
pub struct Pd {
    raw: *mut IbvPd,
    ctx: Arc<Context>,
}

// SAFETY: as `Context`'s: libibverbs objects may be used from any thread; the domain is
// only deallocated in `Drop`, when nothing else holds it.
unsafe impl Send for Pd {}
// SAFETY: as for `Send`; `&Pd` gives only calls libibverbs makes thread-safe.
unsafe impl Sync for Pd {}

impl Pd {
    /// A protection domain on `ctx`: the memory registered in it and the queue pairs made in it
    /// go together.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        let f = lib()?;
        // SAFETY: the context is open.
        let raw = unsafe { (f.alloc_pd)(ctx.raw) };
        if raw.is_null() {
            return Err(VerbsError::call("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd {
            raw,
            ctx: ctx.clone(),
        }))
    }

    /// The device the domain is on.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        if let Ok(f) = lib() {
            // SAFETY: regions and queue pairs hold an Arc of their domain: none is left.
            unsafe { (f.dealloc_pd)(self.raw) };
        }
    }
}

/// Registered memory (`ibv_reg_mr`): the device may read and write it, locally and, with the
/// remote access flags, from peers that hold its `rkey`.
pub struct Mr {
    raw: *mut IbvMr,
    _pd: Arc<Pd>,
}

// SAFETY: a registered region is a libibverbs object usable from any thread; its memory is
// the owner's to keep mapped (`register`'s contract), and it is deregistered only in `Drop`.
unsafe impl Send for Mr {}
// SAFETY: `&Mr` only reads the region's fields, which libibverbs never changes after
// `ibv_reg_mr` returns.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The memory must stay mapped for as long as the region lives.
    pub unsafe fn register(
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: c_int,
    ) -> Result<Mr, VerbsError> {
        let f = lib()?;
        let raw = (f.reg_mr)(pd.raw, addr.cast(), len, access);
        if raw.is_null() {
            return Err(VerbsError::call("ibv_reg_mr"));
        }
        Ok(Mr {
            raw,
            _pd: pd.clone(),
        })
    }

    /// Where the registered region starts, in this process.
    pub fn addr(&self) -> u64 {
        // SAFETY: the region is registered while self lives.
        unsafe { (*self.raw).addr as u64 }
    }

    /// The registered region's length in bytes.
    pub fn len(&self) -> u64 {
        // SAFETY: the region is registered while self lives.
        unsafe { (*self.raw).length as u64 }
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key this side's work requests name the region by.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the region is registered while self lives.
        unsafe { (*self.raw).lkey }
    }

    /// The key a peer's RDMA READ and WRITE name the region by.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the region is registered while self lives.
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Ok(f) = lib() {
            // SAFETY: queue pairs that used this region are destroyed before it (they are
            // dropped first by the types that hold both).
            let rc = unsafe { (f.dereg_mr)(self.raw) };
            if rc != 0 {
                tracing::warn!(error = %std::io::Error::from_raw_os_error(rc),
                    "cannot deregister an RDMA memory region");
            }
        }
    }
}

/// A completion queue, polled (no completion channel: the data path spins on it while it
/// waits for its own work).
pub struct Cq {
    raw: *mut IbvCq,
    poll: PollCqFn,
    _ctx: Arc<Context>,
}

// SAFETY: a completion queue is a libibverbs object usable from any thread (the provider
// locks its polling); it is destroyed only in `Drop`.
unsafe impl Send for Cq {}
// SAFETY: as for `Send`: polling through `&Cq` is what libibverbs makes thread-safe.
unsafe impl Sync for Cq {}

impl Cq {
    /// A completion queue on `ctx` with room for `entries` completions.
    pub fn new(ctx: &Arc<Context>, entries: u32) -> Result<Arc<Cq>, VerbsError> {
        let f = lib()?;
        // SAFETY: no channel, no context; the ops table is the device's.
        let raw = unsafe {
            (f.create_cq)(
                ctx.raw,
                entries as c_int,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        if raw.is_null() {
            return Err(VerbsError::call("ibv_create_cq"));
        }
        // SAFETY: the ops table is filled by the provider when the context opens.
        let poll = unsafe { (*ctx.raw).ops[OPS_POLL_CQ] };
        if poll.is_null() {
            return Err(VerbsError::Device(format!(
                "{}: the provider has no poll_cq",
                ctx.name
            )));
        }
        Ok(Arc::new(Cq {
            raw,
            // SAFETY: the slot holds `int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *)`.
            poll: unsafe { std::mem::transmute::<*const c_void, PollCqFn>(poll) },
            _ctx: ctx.clone(),
        }))
    }

    /// Takes up to `out.len()` completions; answers how many.
    pub fn poll(&self, out: &mut [IbvWc]) -> Result<usize, VerbsError> {
        // SAFETY: `out` has room for the count given.
        let n = unsafe { (self.poll)(self.raw, out.len() as c_int, out.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::errno("ibv_poll_cq", -n));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if let Ok(f) = lib() {
            // SAFETY: queue pairs hold an Arc of their queue: none is left.
            unsafe { (f.destroy_cq)(self.raw) };
        }
    }
}

/// Where a queue pair is, as its peer needs it to connect (sent over the TCP connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// The sender's port MTU (the verbs enum: 1 = 256 bytes … 5 = 4096).
    pub mtu: u8,
}

/// The path settings of a local port, fixed when a queue pair is made.
#[derive(Clone, Copy, Debug)]
pub struct PortPath {
    pub port: u8,
    pub gid_index: u8,
    pub gid: [u8; 16],
    pub lid: u16,
    pub mtu: u8,
}

/// A reliable-connected queue pair, with one completion queue for its sends.
pub struct Qp {
    raw: *mut IbvQp,
    post: PostSendFn,
    cq: Arc<Cq>,
    _pd: Arc<Pd>,
    path: PortPath,
    psn: u32,
}

// SAFETY: a queue pair is a libibverbs object usable from any thread (posting takes the
// provider's lock); it is destroyed only in `Drop`, before the region and queue it holds.
unsafe impl Send for Qp {}
// SAFETY: as for `Send`: posts and state changes through `&Qp` are thread-safe in libibverbs.
unsafe impl Sync for Qp {}

/// Outstanding RDMA READs per queue pair, each way: rxe and ConnectX both take 16.
pub const RD_ATOMIC: u8 = 16;

impl Qp {
    /// A reliable-connected queue pair in `pd`, completing into `cq`, over `path`, with `depth`
    /// work requests outstanding at most; still in RESET.
    pub fn new(pd: &Arc<Pd>, cq: &Arc<Cq>, path: PortPath, depth: u32) -> Result<Qp, VerbsError> {
        let f = lib()?;
        let mut init = IbvQpInitAttr {
            qp_context: ptr::null_mut(),
            send_cq: cq.raw,
            recv_cq: cq.raw,
            srq: ptr::null_mut(),
            cap: IbvQpCap {
                max_send_wr: depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the domain and queue are live and held by the pair.
        let raw = unsafe { (f.create_qp)(pd.raw, &mut init) };
        if raw.is_null() {
            return Err(VerbsError::call("ibv_create_qp"));
        }
        // SAFETY: as for poll_cq: the provider's post_send.
        let post = unsafe { (*pd.ctx.raw).ops[OPS_POST_SEND] };
        if post.is_null() {
            // SAFETY: the pair was just made and is not used.
            unsafe { (f.destroy_qp)(raw) };
            return Err(VerbsError::Device(format!(
                "{}: the provider has no post_send",
                pd.ctx.name
            )));
        }
        Ok(Qp {
            raw,
            // SAFETY: the slot holds `int (*post_send)(struct ibv_qp *, struct ibv_send_wr *,
            // struct ibv_send_wr **)`.
            post: unsafe { std::mem::transmute::<*const c_void, PostSendFn>(post) },
            cq: cq.clone(),
            _pd: pd.clone(),
            path,
            psn: fastrand::u32(..) & 0xff_ffff,
        })
    }

    /// The pair with `psn` as its send sequence number, for peers that do not exchange one.
    pub fn with_psn(mut self, psn: u32) -> Qp {
        self.psn = psn & 0xff_ffff;
        self
    }

    /// What the peer needs to connect to this pair: its number, first packet sequence number,
    /// LID and GID.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            // SAFETY: the pair is live.
            qpn: unsafe { (*self.raw).qp_num },
            psn: self.psn,
            lid: self.path.lid,
            gid: self.path.gid,
            mtu: self.path.mtu,
        }
    }

    /// The completion queue the pair completes into.
    pub fn cq(&self) -> &Arc<Cq> {
        &self.cq
    }

    /// Moves the pair through INIT, RTR and RTS to talk to `remote`; `access` is what the peer
    /// may do to this side's memory (remote read and write for a store; none for a client).
    pub fn connect(&self, remote: &QpEndpoint, access: c_int) -> Result<(), VerbsError> {
        let mut a = IbvQpAttr {
            qp_state: QPS_INIT,
            pkey_index: 0,
            port_num: self.path.port,
            qp_access_flags: access,
            ..Default::default()
        };
        self.modify(
            &mut a,
            QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let mut a = IbvQpAttr {
            qp_state: QPS_RTR,
            path_mtu: u32::from(self.path.mtu.min(remote.mtu)),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: RD_ATOMIC,
            min_rnr_timer: 12,
            ah_attr: IbvAhAttr {
                grh: IbvGlobalRoute {
                    dgid: IbvGid(remote.gid),
                    flow_label: 0,
                    sgid_index: self.path.gid_index,
                    hop_limit: 64,
                    traffic_class: 0,
                },
                dlid: remote.lid,
                sl: 0,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(remote.gid != [0; 16]),
                port_num: self.path.port,
            },
            ..Default::default()
        };
        self.modify(
            &mut a,
            QP_STATE
                | QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = IbvQpAttr {
            qp_state: QPS_RTS,
            sq_psn: self.psn,
            // 4.096 µs × 2^14 ≈ 67 ms per try, 7 tries: a dead peer is found in about half a
            // second, not after the default's minutes.
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: RD_ATOMIC,
            ..Default::default()
        };
        self.modify(
            &mut a,
            QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Puts the pair in the error state: what is posted completes with a flush error, and the
    /// peer can no longer reach this side's memory through it.
    pub fn fail(&self) {
        let mut a = IbvQpAttr {
            qp_state: QPS_ERR,
            ..Default::default()
        };
        let _ = self.modify(&mut a, QP_STATE, "ERR");
    }

    fn modify(&self, a: &mut IbvQpAttr, mask: c_int, to: &str) -> Result<(), VerbsError> {
        let f = lib()?;
        // SAFETY: the pair is live; `a` is a complete attribute struct.
        let rc = unsafe { (f.modify_qp)(self.raw, a, mask) };
        if rc != 0 {
            return Err(VerbsError::Device(format!(
                "ibv_modify_qp to {to} failed: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Posts a chain of work requests with one doorbell. `wrs[i].next` and `sg_list` are set
    /// here: each request has the one scatter-gather entry `sges[i]`.
    ///
    /// # Safety
    /// The local memory each entry names must stay registered and untouched, and the remote
    /// ranges valid, until the request's completion is polled (or the pair is destroyed).
    pub unsafe fn post(
        &self,
        wrs: &mut [IbvSendWr],
        sges: &mut [IbvSge],
    ) -> Result<(), VerbsError> {
        debug_assert_eq!(wrs.len(), sges.len());
        if wrs.is_empty() {
            return Ok(());
        }
        let n = wrs.len();
        let base = wrs.as_mut_ptr();
        for i in 0..n {
            let wr = &mut *base.add(i);
            wr.sg_list = sges.as_mut_ptr().add(i);
            wr.num_sge = 1;
            wr.next = if i + 1 < n {
                base.add(i + 1)
            } else {
                ptr::null_mut()
            };
        }
        let mut bad: *mut IbvSendWr = ptr::null_mut();
        let rc = (self.post)(self.raw, base, &mut bad);
        if rc != 0 {
            return Err(VerbsError::errno("ibv_post_send", rc));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Ok(f) = lib() {
            // SAFETY: nothing else holds the raw pair; its queue and domain outlive it.
            let rc = unsafe { (f.destroy_qp)(self.raw) };
            if rc != 0 {
                tracing::warn!(error = %std::io::Error::from_raw_os_error(rc),
                    "cannot destroy an RDMA queue pair");
            }
        }
    }
}

/// A READ or WRITE of `len` bytes between local registered memory and a peer's.
pub fn rdma_wr(opcode: u32, wr_id: u64, remote_addr: u64, rkey: u32, signaled: bool) -> IbvSendWr {
    IbvSendWr {
        wr_id,
        opcode,
        send_flags: if signaled { SEND_SIGNALED } else { 0 },
        remote_addr,
        rkey,
        ..Default::default()
    }
}
