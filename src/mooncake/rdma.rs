//! Mooncake's RDMA transport on the wire: a segment's `protocol: "rdma"` descriptor and the
//! Connection (type 0) handshake that sets up an endpoint's queue pairs.
//!
//! A Mooncake endpoint is the set of QPs between one local NIC and one peer NIC, each named by
//! its "nic path", `<server name>@<device>`. The initiator sends its nic path, the nic path it
//! wants on the other side, its GID and LID and its QP numbers; the other side creates as many
//! QPs, moves them to RTS and answers the same way. QPs pair by index, PSNs are 0 in both
//! directions and never exchanged, and nothing tears an endpoint down: a peer that comes back
//! handshakes again from the same nic path. Then the initiator READs and WRITEs the segment's
//! registered memory one-sided. (../shared/reference/mooncake-wire/RDMA.md has the details.)
//!
//! Pure: encoding, decoding and the checks a passive side makes, tested without a NIC.

use serde_json::{json, Value};

/// QPs per endpoint in Mooncake's default configuration (`MC_NUM_QP_PER_EP`); it is never
/// advertised, and both sides must agree.
pub const DEFAULT_QPS_PER_ENDPOINT: usize = 2;
/// The most QPs one handshake may ask for (Mooncake accepts 1 to 255).
pub const MAX_QPS_PER_ENDPOINT: usize = 255;
/// The Connection exchange's type byte.
pub const CONNECTION: u8 = 0;
/// The PSN both sides start at: Mooncake never exchanges one.
pub const PSN: u32 = 0;
/// Mooncake's path MTU ceiling (`MC_MTU`, 4096 bytes: the verbs enum's 5), never exchanged:
/// with it a QP takes its own port's active MTU, as Mooncake's do.
pub const MTU_CEILING: u8 = 5;

/// Why a Mooncake RDMA descriptor or handshake could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RdmaWireError {
    #[error("{0}: {1}")]
    Descriptor(String, String),
    #[error("Connection message: {0}")]
    Connection(String),
}

/// A GID as Mooncake writes it: 16 bytes as lowercase hex pairs joined by `:`.
pub fn gid_text(gid: &[u8; 16]) -> String {
    let mut out = String::with_capacity(47);
    for (i, b) in gid.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A GID in Mooncake's form (exactly 16 hex pairs joined by `:`).
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    let mut parts = text.split(':');
    for b in gid.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(gid)
}

/// `<server name>@<device>`: one NIC of one Transfer Engine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NicPath {
    pub server: String,
    pub device: String,
}

impl NicPath {
    /// The NIC `device` of the Transfer Engine server `server`.
    pub fn new(server: &str, device: &str) -> NicPath {
        NicPath {
            server: server.to_string(),
            device: device.to_string(),
        }
    }

    /// Splits at the last `@` (a server name may hold one; a device name does not).
    pub fn parse(text: &str) -> Option<NicPath> {
        let (server, device) = text.rsplit_once('@')?;
        (!server.is_empty() && !device.is_empty()).then(|| NicPath::new(server, device))
    }
}

impl std::fmt::Display for NicPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.server, self.device)
    }
}

/// One RDMA device of a descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub lid: u16,
    pub gid: [u8; 16],
}

/// One registered region of a descriptor, with its key on each device (in `devices` order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// The memory's location (Mooncake's topology key, e.g. `cpu:0`), not the segment's name.
    pub location: String,
    pub addr: u64,
    pub length: u64,
    pub rkeys: Vec<u32>,
    pub lkeys: Vec<u32>,
}

/// A segment's `protocol: "rdma"` descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub name: String,
    /// Set only with Mooncake's `MC_RDMA_BIND_ADDRESS`; nic paths then use it for the server.
    pub rdma_server_name: String,
    pub devices: Vec<Device>,
    pub buffers: Vec<Buffer>,
}

impl Descriptor {
    /// The JSON Mooncake's `TransferMetadata` decodes. Every location's priority lists every
    /// device as preferred, in `devices` order: a reader then numbers the devices as they are
    /// listed, whatever order it walks the matrix in.
    pub fn to_json(&self) -> Value {
        let names: Vec<&str> = self.devices.iter().map(|d| d.name.as_str()).collect();
        let mut matrix = serde_json::Map::new();
        for b in &self.buffers {
            matrix.insert(b.location.clone(), json!([names, Vec::<&str>::new()]));
        }
        json!({
            "name": self.name,
            "protocol": "rdma",
            "devices": self.devices.iter().map(|d| json!({"name": d.name, "lid": d.lid, "gid": gid_text(&d.gid)})).collect::<Vec<_>>(),
            "buffers": self.buffers.iter().map(|b| json!({
                "name": b.location, "addr": b.addr, "length": b.length, "rkey": b.rkeys, "lkey": b.lkeys,
            })).collect::<Vec<_>>(),
            "priority_matrix": matrix,
            "rdma_server_name": self.rdma_server_name,
            "tcp_data_port": 0,
            "tcp_proto_version": 1,
            "timestamp": chrono::Utc::now().format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
        })
    }

    /// A peer's descriptor, refused where Mooncake's own decoder refuses it, and where no
    /// transfer could use it (no priority matrix naming a listed device).
    pub fn parse(what: &str, v: &Value) -> Result<Descriptor, RdmaWireError> {
        let bad = |why: &str| RdmaWireError::Descriptor(what.to_string(), why.to_string());
        if v.get("protocol").and_then(Value::as_str) != Some("rdma") {
            return Err(bad("not an rdma segment descriptor"));
        }
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            return Err(bad("no name"));
        }
        let devices = v
            .get("devices")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no devices"))?
            .iter()
            .map(|d| {
                let name = d.get("name").and_then(Value::as_str).unwrap_or_default();
                let gid = d.get("gid").and_then(Value::as_str).and_then(parse_gid);
                let lid = d.get("lid").and_then(Value::as_u64).unwrap_or(0);
                match (name.is_empty(), gid, u16::try_from(lid)) {
                    (false, Some(gid), Ok(lid)) => Ok(Device {
                        name: name.to_string(),
                        lid,
                        gid,
                    }),
                    _ => Err(bad(&format!("device {d} has no name, no GID or a bad LID"))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if devices.is_empty() {
            return Err(bad("no devices"));
        }
        let keys = |b: &Value, field: &str| -> Option<Vec<u32>> {
            b.get(field)?
                .as_array()?
                .iter()
                .map(|k| k.as_u64().and_then(|k| u32::try_from(k).ok()))
                .collect()
        };
        let buffers = v
            .get("buffers")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no buffers"))?
            .iter()
            .map(|b| {
                let location = b.get("name").and_then(Value::as_str).unwrap_or_default();
                let addr = b.get("addr").and_then(Value::as_u64).unwrap_or(0);
                let length = b.get("length").and_then(Value::as_u64).unwrap_or(0);
                let (Some(rkeys), Some(lkeys)) = (keys(b, "rkey"), keys(b, "lkey")) else {
                    return Err(bad("a buffer's rkey or lkey is not a list of keys"));
                };
                if location.is_empty()
                    || addr == 0
                    || length == 0
                    || addr.checked_add(length).is_none()
                {
                    return Err(bad("a buffer has no name, address or length"));
                }
                // No keys: registered for local use only (a client's staging buffer), which
                // no peer reaches; otherwise one key per device.
                if !rkeys.is_empty() && (rkeys.len() != devices.len() || lkeys.len() != rkeys.len())
                {
                    return Err(bad("a buffer's keys do not match its devices one to one"));
                }
                Ok(Buffer {
                    location: location.to_string(),
                    addr,
                    length,
                    rkeys,
                    lkeys,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Each location maps to [preferred devices, available devices]; some must be listed.
        let entries: Vec<&Vec<Value>> = v
            .get("priority_matrix")
            .and_then(Value::as_object)
            .and_then(|m| m.values().map(Value::as_array).collect::<Option<Vec<_>>>())
            .unwrap_or_default();
        let well_formed = !entries.is_empty() && entries.iter().all(|e| e.len() == 2);
        let listed = entries
            .iter()
            .flat_map(|e| e.iter().filter_map(Value::as_array).flatten())
            .filter_map(Value::as_str)
            .any(|n| devices.iter().any(|d| d.name == n));
        let usable = well_formed && listed;
        if !usable {
            return Err(bad("its priority_matrix names none of its devices"));
        }
        Ok(Descriptor {
            name: name.to_string(),
            rdma_server_name: v
                .get("rdma_server_name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            devices,
            buffers,
        })
    }

    /// The server part of this engine's nic paths.
    pub fn nic_server(&self) -> &str {
        if self.rdma_server_name.is_empty() {
            &self.name
        } else {
            &self.rdma_server_name
        }
    }

    /// The buffer peers may reach (it has keys) holding `[addr, addr + len)`, if one does.
    pub fn buffer_for(&self, addr: u64, len: u64) -> Option<&Buffer> {
        let end = addr.checked_add(len)?;
        self.buffers
            .iter()
            .find(|b| !b.rkeys.is_empty() && addr >= b.addr && end <= b.addr + b.length)
    }
}

/// A Connection message, request or reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    pub local_nic_path: String,
    pub peer_nic_path: String,
    /// Absent in requests from Mooncake before May 2026: the sender's descriptor has it.
    pub local_gid: Option<[u8; 16]>,
    pub local_lid: u16,
    pub qp_num: Vec<u32>,
    /// Empty: accepted. Otherwise the reason for refusing.
    pub reply_msg: String,
    /// Present when the sender supports Mooncake's ready-ACK; `true` marks the ACK itself.
    pub ready_ack: Option<bool>,
}

impl Connection {
    /// The connection as Mooncake's handshake JSON writes it.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "local_nic_path": self.local_nic_path,
            "peer_nic_path": self.peer_nic_path,
            "local_gid": self.local_gid.as_ref().map(gid_text).unwrap_or_default(),
            "local_lid": self.local_lid,
            "qp_num": self.qp_num,
            "reply_msg": self.reply_msg,
            "payload": "",
        });
        if let Some(ack) = self.ready_ack {
            v["ready_ack"] = json!(ack);
        }
        v
    }

    /// A peer's message; fields Mooncake added later may be missing, and fields rbgctl does not
    /// use (`payload`, the two-sided notify channel's) are ignored.
    pub fn parse(v: &Value) -> Result<Connection, RdmaWireError> {
        let text = |field: &str| {
            v.get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let bad = |why: String| RdmaWireError::Connection(why);
        let qp_num = v
            .get("qp_num")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no qp_num list".into()))?
            .iter()
            .map(|q| {
                q.as_u64()
                    .filter(|&q| q > 0 && q < 1 << 24)
                    .map(|q| q as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("a QP number is not a 24-bit number".into()))?;
        let local_gid = match v.get("local_gid").and_then(Value::as_str) {
            None | Some("") => None,
            Some(g) => Some(parse_gid(g).ok_or_else(|| bad(format!("Invalid peer GID: {g}")))?),
        };
        let local_lid = v.get("local_lid").and_then(Value::as_u64).unwrap_or(0);
        Ok(Connection {
            local_nic_path: text("local_nic_path"),
            peer_nic_path: text("peer_nic_path"),
            local_gid,
            local_lid: u16::try_from(local_lid)
                .map_err(|_| bad(format!("LID {local_lid} is out of range")))?,
            qp_num,
            reply_msg: text("reply_msg"),
            ready_ack: v.get("ready_ack").and_then(Value::as_bool),
        })
    }
}

/// What a passive side answers to a request before it creates anything: the local device the
/// request names and the sender's nic path, or the `reply_msg` that refuses it (Mooncake's own
/// words where it has them).
pub fn check_request(
    req: &Connection,
    own_server: &str,
    devices: &[&str],
    max_qps: usize,
) -> Result<(usize, NicPath), String> {
    let Some(wanted) = NicPath::parse(&req.peer_nic_path) else {
        return Err(format!(
            "Invalid peer_nic_path in handshake: {}",
            req.peer_nic_path
        ));
    };
    let Some(device) = devices.iter().position(|d| *d == wanted.device) else {
        return Err(format!(
            "Local RDMA context not found for {}",
            req.peer_nic_path
        ));
    };
    if wanted.server != own_server {
        return Err(format!(
            "Invalid argument: peer nic path inconsistency: {} is not {}@{}",
            req.peer_nic_path, own_server, wanted.device
        ));
    }
    let Some(sender) = NicPath::parse(&req.local_nic_path) else {
        return Err(format!(
            "Invalid local_nic_path in handshake: {}",
            req.local_nic_path
        ));
    };
    if req.qp_num.is_empty() || req.qp_num.len() > max_qps {
        return Err(format!(
            "QP count mismatch in peer and local endpoints, check MC_MAX_EP_PER_CTX ({} QPs asked, 1 to {max_qps} served)",
            req.qp_num.len()
        ));
    }
    Ok((device, sender))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];

    fn descriptor() -> Descriptor {
        Descriptor {
            name: "10.0.2.15:16001".into(),
            rdma_server_name: String::new(),
            devices: vec![
                Device {
                    name: "rxe0".into(),
                    lid: 0,
                    gid: GID,
                },
                Device {
                    name: "rxe1".into(),
                    lid: 0,
                    gid: GID,
                },
            ],
            buffers: vec![Buffer {
                location: "cpu:0".into(),
                addr: 0x7f00_0000_0000,
                length: 64 << 20,
                rkeys: vec![17, 18],
                lkeys: vec![0, 0],
            }],
        }
    }

    #[test]
    fn gids_read_back_in_mooncakes_form() {
        let text = gid_text(&GID);
        assert_eq!(text, "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:0f");
        assert_eq!(parse_gid(&text), Some(GID));
        for bad in [
            "",
            "00:00",
            "0:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:0f",
            &format!("{text}:00"),
            "zz:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:0f",
        ] {
            assert_eq!(parse_gid(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_descriptor_reads_back_and_lists_every_device_for_every_location() {
        let d = descriptor();
        let v = d.to_json();
        assert_eq!(v["protocol"], "rdma");
        assert_eq!(v["priority_matrix"]["cpu:0"], json!([["rxe0", "rxe1"], []]));
        assert_eq!(v["buffers"][0]["rkey"], json!([17, 18]));
        assert_eq!(v["tcp_proto_version"], 1);
        assert_eq!(Descriptor::parse("s", &v).unwrap(), d);
        assert_eq!(d.nic_server(), "10.0.2.15:16001");
        assert!(d.buffer_for(0x7f00_0000_0000 + 4096, 4096).is_some());
        assert!(d.buffer_for(0x7f00_0000_0000 + (64 << 20) - 1, 2).is_none());
        assert!(d.buffer_for(u64::MAX, 2).is_none());
        // A buffer registered for local use only (no keys, as a wheel client's staging buffer
        // is published) is legal and reached by no one.
        let mut v = d.to_json();
        v["buffers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "cpu:0", "addr": 4096, "length": 4096, "rkey": [], "lkey": []}));
        let with_local = Descriptor::parse("s", &v).unwrap();
        assert_eq!(with_local.buffers.len(), 2);
        assert!(with_local.buffer_for(4096, 16).is_none());
    }

    #[test]
    fn descriptors_mooncake_would_refuse_are_refused() {
        let good = descriptor().to_json();
        type Change = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(&str, Change)> = vec![
            ("not an rdma", Box::new(|v| v["protocol"] = json!("tcp"))),
            ("no name", Box::new(|v| v["name"] = json!(""))),
            ("no GID", Box::new(|v| v["devices"][0]["gid"] = json!(""))),
            (
                "one to one",
                Box::new(|v| v["buffers"][0]["rkey"] = json!([17])),
            ),
            ("address", Box::new(|v| v["buffers"][0]["addr"] = json!(0))),
            (
                "priority_matrix",
                Box::new(|v| v["priority_matrix"] = json!(null)),
            ),
            (
                "priority_matrix",
                Box::new(|v| v["priority_matrix"] = json!({"cpu:0": [["mlx5_0"], []]})),
            ),
            (
                "priority_matrix",
                Box::new(|v| v["priority_matrix"] = json!({"cpu:0": ["rxe0"]})),
            ),
        ];
        for (why, change) in cases {
            let mut v = good.clone();
            change(&mut v);
            let e = Descriptor::parse("peer", &v).unwrap_err().to_string();
            assert!(e.contains(why) && e.starts_with("peer: "), "{why}: {e}");
        }
        let mut v = good.clone();
        v["rdma_server_name"] = json!("10.0.2.15:17000");
        assert_eq!(
            Descriptor::parse("p", &v).unwrap().nic_server(),
            "10.0.2.15:17000"
        );
    }

    #[test]
    fn connection_messages_read_back_old_and_new() {
        let req = Connection {
            local_nic_path: "10.0.2.15:15123@rxe0".into(),
            peer_nic_path: "10.0.2.15:16001@rxe0".into(),
            local_gid: Some(GID),
            local_lid: 0,
            qp_num: vec![17, 18],
            reply_msg: String::new(),
            ready_ack: None,
        };
        let v = req.to_json();
        assert!(
            v.get("ready_ack").is_none(),
            "omitted: Mooncake's legacy mode, no second message"
        );
        assert_eq!(Connection::parse(&v).unwrap(), req);
        // Mooncake before May 2026: no local_gid; with ready-ACK support and the notify fields.
        let old = json!({"local_nic_path": "a:1@rxe0", "peer_nic_path": "b:2@rxe0", "local_lid": 0,
            "qp_num": [5, 6], "reply_msg": "", "ready_ack": false, "payload": "", "notify_qp_num": 9});
        let c = Connection::parse(&old).unwrap();
        assert_eq!((c.local_gid, c.ready_ack), (None, Some(false)));
        for bad in [
            json!({"qp_num": [0]}),
            json!({"qp_num": [1 << 24]}),
            json!({"qp_num": "17"}),
            json!({"qp_num": [1], "local_gid": "fe80::1"}),
            json!({"qp_num": [1], "local_lid": 70000}),
        ] {
            assert!(Connection::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_passive_side_refuses_what_it_cannot_serve_in_mooncakes_words() {
        let mut req = Connection::parse(&json!({"local_nic_path": "10.0.2.15:15123@rxe0",
            "peer_nic_path": "10.0.2.15:16001@rxe1", "qp_num": [17, 18]}))
        .unwrap();
        let devices = ["rxe0", "rxe1"];
        let (dev, sender) = check_request(&req, "10.0.2.15:16001", &devices, 8).unwrap();
        assert_eq!((dev, sender), (1, NicPath::new("10.0.2.15:15123", "rxe0")));
        let refused =
            |req: &Connection| check_request(req, "10.0.2.15:16001", &devices, 8).unwrap_err();
        req.peer_nic_path = "10.0.2.15:16001@mlx5_0".into();
        assert!(refused(&req).starts_with("Local RDMA context not found"));
        req.peer_nic_path = "10.0.2.15:9@rxe0".into();
        assert!(refused(&req).starts_with("Invalid argument: peer nic path inconsistency"));
        req.peer_nic_path = "rxe0".into();
        assert!(refused(&req).starts_with("Invalid peer_nic_path"));
        req.peer_nic_path = "10.0.2.15:16001@rxe0".into();
        req.qp_num = vec![1; 9];
        assert!(refused(&req).starts_with("QP count mismatch"));
        req.qp_num = vec![1];
        req.local_nic_path = "nobody".into();
        assert!(refused(&req).starts_with("Invalid local_nic_path"));
    }

    /// Mooncake's wheel against itself over soft-RoCE (`scripts/mooncake-rdma-capture.py` in the
    /// RDMA VM): its descriptor and its Connection exchange, ready-ACK included.
    fn wheel_capture() -> Value {
        serde_json::from_str(include_str!(
            "../../tests/vectors/mooncake/rdma/wheel-to-wheel.json"
        ))
        .unwrap()
    }

    #[test]
    fn the_wheels_own_descriptor_and_handshake_read_as_mooncake_meant_them() {
        let cap = wheel_capture();
        assert!(
            cap["checks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["equal"] == true),
            "the capture moved bytes right"
        );
        let d = Descriptor::parse("wheel", &cap["descriptor"]).unwrap();
        assert_eq!(d.nic_server(), "10.0.2.15:17001");
        assert_eq!(d.devices[0].name, "rxe0");
        assert_eq!(d.devices[0].gid, GID);
        assert_eq!(d.buffers[0].location, "cpu:0");
        assert_eq!(d.buffers[0].rkeys.len(), 1);
        // Ours has the same keys, and the matrix shape the wheel's has.
        let ours = descriptor().to_json();
        let keys = |v: &Value| {
            v.as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
        };
        let mut wheel_keys = keys(&cap["descriptor"]);
        wheel_keys.insert("rdma_server_name".into()); // the wheel writes it empty for tcp only
        assert_eq!(keys(&ours), wheel_keys);
        assert_eq!(
            keys(&ours["buffers"][0]),
            keys(&cap["descriptor"]["buffers"][0])
        );

        let frames = cap["frames"].as_array().unwrap();
        assert!(frames.iter().all(|f| f["type"] == CONNECTION));
        let req = Connection::parse(&frames[0]["json"]).unwrap();
        assert_eq!(req.qp_num.len(), DEFAULT_QPS_PER_ENDPOINT);
        assert_eq!(req.ready_ack, Some(false), "the wheel offers ready-ACK");
        let (dev, sender) =
            check_request(&req, d.nic_server(), &["rxe0"], MAX_QPS_PER_ENDPOINT).unwrap();
        assert_eq!((dev, sender.to_string()), (0, req.local_nic_path.clone()));
        let reply = Connection::parse(&frames[1]["json"]).unwrap();
        assert_eq!(
            reply.ready_ack,
            Some(false),
            "a passive wheel offers ready-ACK back"
        );
        assert_eq!(
            (reply.local_nic_path.as_str(), reply.peer_nic_path.as_str()),
            (req.peer_nic_path.as_str(), req.local_nic_path.as_str())
        );
        // Our reply has the wheel's fields but ready_ack, whose absence keeps the wheel from
        // sending the ready-ACK (its legacy mode); one that comes anyway (same QPs, ready_ack
        // true) is answered with an empty message, as the wheel answers it.
        let ours = Connection {
            ready_ack: None,
            ..reply.clone()
        }
        .to_json();
        let mut wheel_reply = keys(&frames[1]["json"]);
        wheel_reply.remove("ready_ack");
        assert_eq!(keys(&ours), wheel_reply);
        let ack = Connection::parse(&frames[2]["json"]).unwrap();
        assert_eq!((ack.ready_ack, &ack.qp_num), (Some(true), &req.qp_num));
        let empty = Connection::parse(&frames[3]["json"]).unwrap();
        assert!(
            empty.reply_msg.is_empty()
                && empty.qp_num.is_empty()
                && empty.local_nic_path.is_empty()
        );
    }

    #[test]
    fn nic_paths_split_at_the_last_at() {
        assert_eq!(
            NicPath::parse("user@host:1@rxe0"),
            Some(NicPath::new("user@host:1", "rxe0"))
        );
        assert_eq!(NicPath::parse("host:1@"), None);
        assert_eq!(NicPath::parse("@rxe0"), None);
        assert_eq!(NicPath::new("h:1", "rxe0").to_string(), "h:1@rxe0");
    }
}
