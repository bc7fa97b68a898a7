//! SOCKS5 for crawlers whose tooling speaks it: the protocol on the wire ([`wire`]).

pub mod wire;
