//! An RDMA NIC opened for the data path: its device context, one protection domain, and the
//! port path (port 1, its GID index and MTU) that every queue pair on it uses. The GID index is
//! found as Mooncake and perftest users expect: RoCE v2 with an IPv4-mapped address when the
//! link layer is Ethernet, unless `MC_GID_INDEX` (or the configuration) names one.

use super::verbs::{Context, Pd, PortPath, VerbsError, LINK_LAYER_ETHERNET, PORT_ACTIVE};
use std::path::Path;
use std::sync::Arc;

/// The port every queue pair uses (multi-port NICs: name the other port's device instead).
pub const PORT: u8 = 1;

/// Mooncake's variable for the GID index.
pub const GID_INDEX_ENV: &str = "MC_GID_INDEX";

/// An RDMA device's port, opened: its protection domain and its port path.
pub struct Nic {
    pub pd: Arc<Pd>,
    pub path: PortPath,
}

impl Nic {
    /// Opens `name` and checks its port: ACTIVE, and (RoCE) a usable GID.
    pub fn open(name: &str, gid_index: Option<u32>) -> Result<Nic, VerbsError> {
        let ctx = Context::open(name)?;
        let port = ctx.query_port(PORT)?;
        if port.state != PORT_ACTIVE {
            return Err(VerbsError::Device(format!(
                "port {PORT} of RDMA device {name} is {} (state {}), not ACTIVE: bring its link \
                 up (for soft-RoCE, the network interface it was added on)",
                port_state_name(port.state),
                port.state
            )));
        }
        let ethernet = port.link_layer == LINK_LAYER_ETHERNET;
        let gid_index = match gid_index.or_else(gid_index_from_env) {
            Some(i) => i,
            None if ethernet => {
                let table = read_gid_table(name, PORT, port.gid_tbl_len.max(0) as u32);
                choose_gid(&table).ok_or_else(|| {
                    VerbsError::Device(format!(
                        "RDMA device {name} has no RoCE GID on port {PORT}: give its network \
                         interface an IP address, or name a GID index with {GID_INDEX_ENV}"
                    ))
                })?
            }
            // InfiniBand: routed by LID; GID 0 is the port's own.
            None => 0,
        };
        if gid_index > u32::from(u8::MAX) {
            return Err(VerbsError::Device(format!(
                "GID index {gid_index} is out of range (0-255)"
            )));
        }
        let gid = ctx.query_gid(PORT, gid_index)?;
        if ethernet && gid.0 == [0; 16] {
            return Err(VerbsError::Device(format!(
                "GID {gid_index} of RDMA device {name} is empty: choose another with \
                 {GID_INDEX_ENV}"
            )));
        }
        let pd = Pd::new(&ctx)?;
        tracing::info!(device = name, gid_index, gid = %gid_text(&gid.0), mtu = mtu_bytes(port.active_mtu),
            lid = port.lid, "RDMA device ready");
        Ok(Nic {
            pd,
            path: PortPath {
                port: PORT,
                gid_index: gid_index as u8,
                gid: gid.0,
                lid: port.lid,
                mtu: port.active_mtu as u8,
            },
        })
    }

    /// The NIC's device name.
    pub fn name(&self) -> &str {
        self.pd.context().name()
    }
}

/// Opens each named device (`"mlx5_0,mlx5_1"`: several NICs, used in turn by the queue pairs).
pub fn open_all(names: &str, gid_index: Option<u32>) -> Result<Vec<Arc<Nic>>, VerbsError> {
    let names = device_list(names);
    if names.is_empty() {
        let present = super::verbs::device_names()?;
        return Err(VerbsError::Device(if present.is_empty() {
            "protocol rdma needs an RDMA device and this host has none".to_string()
        } else {
            format!(
                "protocol rdma needs device_name (MOONCAKE_DEVICE, --rdma-device): this host has \
                 {}",
                present.join(", ")
            )
        }));
    }
    names
        .iter()
        .map(|n| Nic::open(n, gid_index).map(Arc::new))
        .collect()
}

/// The device names in a `device_name` setting: comma- or space-separated, blanks dropped.
pub fn device_list(names: &str) -> Vec<String> {
    names
        .split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn gid_index_from_env() -> Option<u32> {
    std::env::var(GID_INDEX_ENV).ok()?.trim().parse().ok()
}

/// One row of a port's GID table as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    /// `RoCE v2`, `IB/RoCE v1`; `None` when sysfs does not say.
    pub kind: Option<String>,
}

/// The GID for RoCE: RoCE v2 with an IPv4-mapped address first (routable, and what a store's
/// IPv4 address names), then any RoCE v2, then any non-empty GID.
pub fn choose_gid(table: &[GidEntry]) -> Option<u32> {
    let used = |e: &&GidEntry| e.gid != [0; 16];
    let v2 = |e: &&GidEntry| e.kind.as_deref() == Some("RoCE v2");
    let ipv4 = |e: &&GidEntry| e.gid[..10] == [0; 10] && e.gid[10..12] == [0xff, 0xff];
    table
        .iter()
        .filter(used)
        .filter(v2)
        .find(ipv4)
        .or_else(|| table.iter().filter(used).find(v2))
        .or_else(|| table.iter().find(used))
        .map(|e| e.index)
}

fn read_gid_table(device: &str, port: u8, len: u32) -> Vec<GidEntry> {
    let base = Path::new("/sys/class/infiniband")
        .join(device)
        .join(format!("ports/{port}"));
    (0..len.min(256))
        .filter_map(|index| {
            let text = std::fs::read_to_string(base.join(format!("gids/{index}"))).ok()?;
            let gid = parse_gid(text.trim())?;
            let kind = std::fs::read_to_string(base.join(format!("gid_attrs/types/{index}")))
                .ok()
                .map(|s| s.trim().to_string());
            Some(GidEntry { index, gid, kind })
        })
        .collect()
}

/// `0000:0000:0000:0000:0000:ffff:0a00:020f` → its 16 bytes.
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        let v = u16::from_str_radix(g, 16).ok()?;
        gid[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(gid)
}

/// A GID as text: eight colon-separated groups of four hex digits.
pub fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn port_state_name(state: u32) -> &'static str {
    match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "not up",
    }
}

/// The verbs MTU enum in bytes (1 = 256 … 5 = 4096).
pub fn mtu_bytes(mtu: u32) -> u32 {
    if (1..=5).contains(&mtu) {
        128 << mtu
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: &str, kind: Option<&str>) -> GidEntry {
        GidEntry {
            index,
            gid: parse_gid(gid).unwrap(),
            kind: kind.map(str::to_string),
        }
    }

    #[test]
    fn roce_v2_with_an_ipv4_address_is_chosen_first() {
        let table = [
            entry(
                0,
                "fe80:0000:0000:0000:5054:00ff:fe12:3456",
                Some("IB/RoCE v1"),
            ),
            entry(
                1,
                "fe80:0000:0000:0000:5054:00ff:fe12:3456",
                Some("RoCE v2"),
            ),
            entry(
                2,
                "0000:0000:0000:0000:0000:ffff:0a00:020f",
                Some("IB/RoCE v1"),
            ),
            entry(
                3,
                "0000:0000:0000:0000:0000:ffff:0a00:020f",
                Some("RoCE v2"),
            ),
        ];
        assert_eq!(choose_gid(&table), Some(3));
        // Without an IPv4 one: the first RoCE v2; without RoCE v2: the first that is set.
        assert_eq!(choose_gid(&table[..2]), Some(1));
        assert_eq!(choose_gid(&table[..1]), Some(0));
        let empty = entry(
            0,
            "0000:0000:0000:0000:0000:0000:0000:0000",
            Some("RoCE v2"),
        );
        assert_eq!(choose_gid(&[empty]), None);
    }

    #[test]
    fn gids_and_device_lists_parse_as_sysfs_and_mooncake_write_them() {
        let gid = parse_gid("0000:0000:0000:0000:0000:ffff:0a00:020f").unwrap();
        assert_eq!(&gid[10..], &[0xff, 0xff, 10, 0, 2, 15]);
        assert_eq!(gid_text(&gid), "0000:0000:0000:0000:0000:ffff:0a00:020f");
        assert_eq!(parse_gid("fe80::1"), None);
        assert_eq!(device_list("mlx5_0,mlx5_1"), ["mlx5_0", "mlx5_1"]);
        assert_eq!(device_list(" rxe0 "), ["rxe0"]);
        assert!(device_list(" , ").is_empty());
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
    }
}
