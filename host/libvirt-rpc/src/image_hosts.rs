//! An entry of an image-host allow-list (`grants.libvirt.imageHosts` of the providers config,
//! `imageHosts` of a kvm2 entry): the hosts a URL transfer to a hypervisor may fetch from.
//! Read by the providers config's validation and by the libvirt provider module, so both
//! accept exactly the same entries.

/// `host`, `host:port`, `[ipv6]`, `[ipv6]:port` or a bare IPv6 address; the host a DNS name
/// or an IP address, the port 1-65535.
pub fn is_host_entry(s: &str) -> bool {
    let port_ok = |p: &str| p.parse::<u16>().is_ok_and(|p| p > 0);
    let name_ok = |h: &str| {
        !h.is_empty()
            && !h.starts_with('.')
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, "")) => h.parse::<std::net::Ipv6Addr>().is_ok(),
            Some((h, p)) => {
                h.parse::<std::net::Ipv6Addr>().is_ok() && p.strip_prefix(':').is_some_and(port_ok)
            }
            None => false,
        };
    }
    match s.matches(':').count() {
        0 => name_ok(s),
        1 => s
            .split_once(':')
            .is_some_and(|(h, p)| name_ok(h) && port_ok(p)),
        _ => s.parse::<std::net::Ipv6Addr>().is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::is_host_entry;

    #[test]
    fn names_addresses_and_ports_are_entries_and_schemes_paths_and_bad_ports_are_not() {
        for ok in [
            "images.example.com",
            "images.example.com:8443",
            "192.0.2.1",
            "192.0.2.1:80",
            "[2001:db8::1]",
            "[2001:db8::1]:443",
            "2001:db8::1",
            "mirror_1.example",
        ] {
            assert!(is_host_entry(ok), "{ok}");
        }
        for bad in [
            "",
            ".example.com",
            "https://images.example.com",
            "images.example.com/path",
            "images.example.com:0",
            "images.example.com:65536",
            "images.example.com:",
            "[2001:db8::1]:",
            "[2001:db8::1]x",
            "[not-v6]",
            "a b",
        ] {
            assert!(!is_host_entry(bad), "{bad}");
        }
    }
}
