//! libvirt domain states to contract states, and the address a proxy is reached at.

use guest_sdk::InstanceState;
use guest_sdk::libvirt::{DomainState, InterfaceAddresses};
use std::net::Ipv4Addr;

/// The seeds' table: nostate is Provisioning; running or blocked is Running once an address
/// is known; everything else (paused, shutdown, shutoff, crashed, pmsuspended) is Stopped.
pub fn map_state(state: DomainState, ip: Option<&str>) -> InstanceState {
    match state {
        DomainState::NoState => InstanceState::Provisioning,
        DomainState::Running | DomainState::Blocked => match ip {
            Some(_) => InstanceState::Running,
            None => InstanceState::Provisioning,
        },
        DomainState::Paused
        | DomainState::Shutdown
        | DomainState::Shutoff
        | DomainState::Crashed
        | DomainState::PmSuspended => InstanceState::Stopped,
    }
}

pub fn is_active(state: DomainState) -> bool {
    !matches!(state, DomainState::Shutoff | DomainState::NoState)
}

pub fn state_name(state: DomainState) -> &'static str {
    match state {
        DomainState::NoState => "nostate",
        DomainState::Running => "running",
        DomainState::Blocked => "blocked",
        DomainState::Paused => "paused",
        DomainState::Shutdown => "shutdown",
        DomainState::Shutoff => "shutoff",
        DomainState::Crashed => "crashed",
        DomainState::PmSuspended => "pmsuspended",
    }
}

/// The first routable IPv4 address: loopback, link-local, unspecified and broadcast are
/// dropped, and so is an address whose type tag says IPv6 or that does not parse as IPv4.
pub fn first_ipv4(ifaces: &[InterfaceAddresses]) -> Option<String> {
    ifaces
        .iter()
        .filter(|i| i.name != "lo")
        .flat_map(|i| i.addrs.iter())
        .filter(|a| a.kind == 0)
        .filter_map(|a| a.addr.parse::<Ipv4Addr>().ok())
        .find(|ip| {
            !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified() && !ip.is_broadcast()
        })
        .map(|ip| ip.to_string())
}
