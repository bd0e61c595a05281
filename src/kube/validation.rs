//! Rules the Kubernetes API server applies to what it is sent, where the operator must follow
//! them to avoid a refused write (and the test kit's API server must apply them to catch it).

use std::net::IpAddr;

/// Why an EndpointSlice may not carry `ip` (the API server's `ValidateEndpointIP`): it must be
/// an IP address, and not unspecified, loopback, link-local or link-local multicast.
pub fn endpoint_ip(ip: &str) -> Result<(), &'static str> {
    let Ok(addr) = ip.parse::<IpAddr>() else {
        return Err("must be a valid IP address");
    };
    if addr.is_unspecified() {
        return Err("may not be unspecified (0.0.0.0, ::)");
    }
    if addr.is_loopback() {
        return Err("may not be in the loopback range (127.0.0.0/8, ::1/128)");
    }
    let link_local = match addr {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local {
        return Err("may not be in the link-local range (169.254.0.0/16, fe80::/10)");
    }
    let link_local_multicast = match addr {
        IpAddr::V4(a) => a.octets()[..3] == [224, 0, 0],
        IpAddr::V6(a) => (a.segments()[0] & 0xff0f) == 0xff02,
    };
    if link_local_multicast {
        return Err("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_addresses_follow_the_api_servers_rules() {
        for ok in ["10.244.1.7", "192.168.0.2", "fd00::2", "2001:db8::1"] {
            assert!(endpoint_ip(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("127.1.0.1", "loopback"),
            ("::1", "loopback"),
            ("169.254.3.4", "link-local"),
            ("fe80::1", "link-local"),
            ("224.0.0.5", "multicast"),
            ("0.0.0.0", "unspecified"),
            ("pod-a", "valid IP"),
        ] {
            assert!(endpoint_ip(bad).unwrap_err().contains(why), "{bad}");
        }
    }
}
