//! SOCKS5 on the wire (RFC 1928, with RFC 1929's username/password): the three messages a
//! client sends before its tunnel, read from bytes alone, and the answers to them. Nothing here
//! touches a socket: each reader takes what has arrived and says whether it holds a whole
//! message, how long it was, or what is wrong with it, so the serving side decides how long
//! to wait and how much to buffer. Every message is bounded by its own length fields (the
//! longest, a username and a password of 255 bytes each, is 513 bytes), so a client can make
//! the gateway hold no more than [`MAX_MESSAGE`] bytes before it authenticated.

/// The protocol version of a greeting and a request.
pub const VERSION: u8 = 5;
/// The version of the username/password subnegotiation (RFC 1929 §2).
pub const AUTH_VERSION: u8 = 1;
/// The one method offered: username/password.
pub const USERNAME_PASSWORD: u8 = 0x02;
/// The method selection that refuses every method the client offered.
pub const NO_ACCEPTABLE_METHODS: u8 = 0xFF;
/// The longest message a client sends before its tunnel (an RFC 1929 request: 3 + 255 + 255).
pub const MAX_MESSAGE: usize = 513;

/// Why bytes are not a message of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("SOCKS version {0} is not 5")]
    Version(u8),
    #[error("username/password subnegotiation version {0} is not 1")]
    AuthVersion(u8),
    #[error("a greeting offers no method")]
    NoMethods,
    #[error("the username is empty")]
    EmptyUsername,
    #[error("the request's reserved byte is {0}, not 0")]
    Reserved(u8),
    #[error("address type {0} is none of IPv4 (1), a name (3) or IPv6 (4)")]
    AddressType(u8),
    #[error("the destination name is empty")]
    EmptyName,
}

/// What a reader found in the bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<T> {
    /// Not a whole message yet: wait for more bytes.
    Partial,
    /// A whole message, and how many bytes it took.
    Complete(T, usize),
}

/// A client's greeting: the methods it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub methods: Vec<u8>,
}

impl Greeting {
    /// Whether it offers username/password, the only method served.
    pub fn offers_password(&self) -> bool {
        self.methods.contains(&USERNAME_PASSWORD)
    }
}

/// An RFC 1929 request: the username and password as sent, bytes (the protocol gives them no
/// encoding; what is not text is refused by whoever reads them).
#[derive(PartialEq, Eq)]
pub struct Credentials {
    pub username: Vec<u8>,
    pub password: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is a token, or the username is: neither is ever printed.
        f.debug_struct("Credentials")
            .field("username_len", &self.username.len())
            .field("password_len", &self.password.len())
            .finish()
    }
}

/// The command of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Connect,
    Bind,
    UdpAssociate,
    /// Any other value: answered "command not supported" as BIND and UDP ASSOCIATE are.
    Other(u8),
}

impl Command {
    fn from_byte(b: u8) -> Self {
        match b {
            1 => Self::Connect,
            2 => Self::Bind,
            3 => Self::UdpAssociate,
            other => Self::Other(other),
        }
    }
}

/// Where a request asks to go, as it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    V4(std::net::Ipv4Addr),
    V6(std::net::Ipv6Addr),
    /// A name the client did not resolve (`socks5h`): bytes, 1 to 255 of them.
    Name(Vec<u8>),
}

/// A request: its command and destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub address: Address,
    pub port: u16,
}

impl Request {
    /// The destination as a CONNECT authority (`HOST:PORT`, an IPv6 address bracketed), for
    /// the same validation as the HTTP listener's; None when the name is not ASCII text, which
    /// no DNS name is.
    pub fn authority(&self) -> Option<String> {
        let port = self.port;
        match &self.address {
            Address::V4(a) => Some(format!("{a}:{port}")),
            Address::V6(a) => Some(format!("[{a}]:{port}")),
            Address::Name(n) => {
                let name = std::str::from_utf8(n).ok()?;
                name.is_ascii().then(|| format!("{name}:{port}"))
            }
        }
    }
}

/// A reply's code (RFC 1928 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reply {
    Succeeded,
    GeneralFailure,
    NotAllowed,
    NetworkUnreachable,
    HostUnreachable,
    ConnectionRefused,
    TtlExpired,
    CommandNotSupported,
    AddressTypeNotSupported,
}

impl Reply {
    pub const ALL: [Reply; 9] = [
        Reply::Succeeded,
        Reply::GeneralFailure,
        Reply::NotAllowed,
        Reply::NetworkUnreachable,
        Reply::HostUnreachable,
        Reply::ConnectionRefused,
        Reply::TtlExpired,
        Reply::CommandNotSupported,
        Reply::AddressTypeNotSupported,
    ];

    pub fn code(self) -> u8 {
        match self {
            Reply::Succeeded => 0x00,
            Reply::GeneralFailure => 0x01,
            Reply::NotAllowed => 0x02,
            Reply::NetworkUnreachable => 0x03,
            Reply::HostUnreachable => 0x04,
            Reply::ConnectionRefused => 0x05,
            Reply::TtlExpired => 0x06,
            Reply::CommandNotSupported => 0x07,
            Reply::AddressTypeNotSupported => 0x08,
        }
    }

    /// Its name as a metric label and in the log: one of nine.
    pub fn label(self) -> &'static str {
        match self {
            Reply::Succeeded => "succeeded",
            Reply::GeneralFailure => "general_failure",
            Reply::NotAllowed => "not_allowed",
            Reply::NetworkUnreachable => "network_unreachable",
            Reply::HostUnreachable => "host_unreachable",
            Reply::ConnectionRefused => "connection_refused",
            Reply::TtlExpired => "ttl_expired",
            Reply::CommandNotSupported => "command_not_supported",
            Reply::AddressTypeNotSupported => "address_type_not_supported",
        }
    }

    /// The reply message. Its bound address is always 0.0.0.0:0: the member's socket is the
    /// gateway's business, and a CONNECT client has no use for it.
    pub fn message(self) -> [u8; 10] {
        [VERSION, self.code(), 0, 1, 0, 0, 0, 0, 0, 0]
    }
}

/// The method selection: username/password, or none acceptable.
pub fn method_selection(method: u8) -> [u8; 2] {
    [VERSION, method]
}

/// The subnegotiation's status: 0 for success, anything else fails and closes (RFC 1929 §2).
pub fn auth_status(ok: bool) -> [u8; 2] {
    [AUTH_VERSION, if ok { 0 } else { 1 }]
}

/// A greeting: `VER NMETHODS METHODS…`.
pub fn greeting(buf: &[u8]) -> Result<Read<Greeting>, WireError> {
    let Some(&version) = buf.first() else {
        return Ok(Read::Partial);
    };
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let Some(&n) = buf.get(1) else {
        return Ok(Read::Partial);
    };
    if n == 0 {
        return Err(WireError::NoMethods);
    }
    let end = 2 + usize::from(n);
    match buf.get(2..end) {
        Some(methods) => Ok(Read::Complete(
            Greeting {
                methods: methods.to_vec(),
            },
            end,
        )),
        None => Ok(Read::Partial),
    }
}

/// An RFC 1929 request: `VER ULEN UNAME PLEN PASSWD`. An empty password is taken (the token
/// may be the username alone); an empty username is not.
pub fn credentials(buf: &[u8]) -> Result<Read<Credentials>, WireError> {
    let Some(&version) = buf.first() else {
        return Ok(Read::Partial);
    };
    if version != AUTH_VERSION {
        return Err(WireError::AuthVersion(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Ok(Read::Partial);
    };
    if ulen == 0 {
        return Err(WireError::EmptyUsername);
    }
    let user_end = 2 + usize::from(ulen);
    let Some(&plen) = buf.get(user_end) else {
        return Ok(Read::Partial);
    };
    let end = user_end + 1 + usize::from(plen);
    if buf.len() < end {
        return Ok(Read::Partial);
    }
    Ok(Read::Complete(
        Credentials {
            username: buf[2..user_end].to_vec(),
            password: buf[user_end + 1..end].to_vec(),
        },
        end,
    ))
}

/// A request: `VER CMD RSV ATYP DST.ADDR DST.PORT`.
pub fn request(buf: &[u8]) -> Result<Read<Request>, WireError> {
    if buf.len() < 4 {
        // The version is judged as soon as it arrives, so a client speaking something else
        // is not kept waiting for bytes that would not help.
        return match buf.first() {
            Some(&v) if v != VERSION => Err(WireError::Version(v)),
            _ => Ok(Read::Partial),
        };
    }
    let (version, command, reserved, kind) = (buf[0], buf[1], buf[2], buf[3]);
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    if reserved != 0 {
        return Err(WireError::Reserved(reserved));
    }
    let (address, at) = match kind {
        1 => match buf.get(4..8) {
            Some(b) => (
                Address::V4(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3])),
                8,
            ),
            None => return Ok(Read::Partial),
        },
        4 => match buf.get(4..20).and_then(|b| <[u8; 16]>::try_from(b).ok()) {
            Some(b) => (Address::V6(std::net::Ipv6Addr::from(b)), 20),
            None => return Ok(Read::Partial),
        },
        3 => {
            let Some(&len) = buf.get(4) else {
                return Ok(Read::Partial);
            };
            if len == 0 {
                return Err(WireError::EmptyName);
            }
            let end = 5 + usize::from(len);
            match buf.get(5..end) {
                Some(name) => (Address::Name(name.to_vec()), end),
                None => return Ok(Read::Partial),
            }
        }
        other => return Err(WireError::AddressType(other)),
    };
    let Some(port) = buf.get(at..at + 2) else {
        return Ok(Read::Partial);
    };
    Ok(Read::Complete(
        Request {
            command: Command::from_byte(command),
            address,
            port: u16::from_be_bytes([port[0], port[1]]),
        },
        at + 2,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every proper prefix of `whole` is partial, never an error or a message.
    fn every_prefix_is_partial<T: std::fmt::Debug + PartialEq>(
        whole: &[u8],
        read: impl Fn(&[u8]) -> Result<Read<T>, WireError>,
    ) {
        for cut in 0..whole.len() {
            assert_eq!(read(&whole[..cut]), Ok(Read::Partial), "cut at {cut}");
        }
    }

    #[test]
    fn a_greeting_lists_its_methods_and_says_its_length() {
        let g = [5, 2, 0, 2];
        every_prefix_is_partial(&g, greeting);
        let Ok(Read::Complete(greet, n)) = greeting(&[5, 2, 0, 2, 9, 9]) else {
            panic!()
        };
        assert_eq!(n, 4, "what follows the greeting is not part of it");
        assert!(greet.offers_password());
        let Ok(Read::Complete(greet, _)) = greeting(&[5, 1, 0]) else {
            panic!()
        };
        assert!(!greet.offers_password(), "no authentication only");
        // 255 methods: the longest greeting there is.
        let mut long = vec![5, 255];
        long.extend(0..255u8);
        let Ok(Read::Complete(greet, n)) = greeting(&long) else {
            panic!()
        };
        assert_eq!((greet.methods.len(), n), (255, 257));
    }

    #[test]
    fn a_greeting_of_another_version_or_with_no_method_is_refused() {
        assert_eq!(greeting(&[4, 1, 0]), Err(WireError::Version(4)));
        // An HTTP request sent to the SOCKS port by mistake: 'C' of CONNECT.
        assert_eq!(greeting(b"CONNECT x"), Err(WireError::Version(b'C')));
        assert_eq!(greeting(&[5]), Ok(Read::Partial));
        assert_eq!(greeting(&[5, 0]), Err(WireError::NoMethods));
    }

    #[test]
    fn credentials_are_read_whole_and_never_printed() {
        let mut m = vec![1, 3];
        m.extend(b"web");
        m.push(5);
        m.extend(b"tok-1");
        every_prefix_is_partial(&m, credentials);
        let Ok(Read::Complete(c, n)) = credentials(&m) else {
            panic!()
        };
        assert_eq!(n, m.len());
        assert_eq!(
            (c.username.as_slice(), c.password.as_slice()),
            (&b"web"[..], &b"tok-1"[..])
        );
        assert!(!format!("{c:?}").contains("tok-1"));
        // The token as the username, with an empty password.
        let Ok(Read::Complete(c, n)) = credentials(&[1, 2, b't', b'k', 0]) else {
            panic!()
        };
        assert_eq!(
            (c.username.as_slice(), c.password.len(), n),
            (&b"tk"[..], 0, 5)
        );
        // The longest: 255 and 255.
        let mut long = vec![1, 255];
        long.extend([b'u'; 255]);
        long.push(255);
        long.extend([b'p'; 255]);
        assert_eq!(long.len(), MAX_MESSAGE);
        let Ok(Read::Complete(_, n)) = credentials(&long) else {
            panic!()
        };
        assert_eq!(n, MAX_MESSAGE);
    }

    #[test]
    fn credentials_of_another_version_or_with_no_username_are_refused() {
        assert_eq!(
            credentials(&[5, 1, b'a', 0]),
            Err(WireError::AuthVersion(5))
        );
        assert_eq!(credentials(&[1, 0, 0]), Err(WireError::EmptyUsername));
        // A username that claims more bytes than arrived waits for them, no more: its length
        // byte bounds it.
        assert_eq!(credentials(&[1, 255, b'a']), Ok(Read::Partial));
    }

    #[test]
    fn a_request_reads_each_address_type() {
        let v4 = [5, 1, 0, 1, 127, 0, 0, 9, 1, 187];
        every_prefix_is_partial(&v4, request);
        let Ok(Read::Complete(r, n)) = request(&v4) else {
            panic!()
        };
        assert_eq!(n, 10);
        assert_eq!(r.command, Command::Connect);
        assert_eq!(r.authority().unwrap(), "127.0.0.9:443");

        let mut v6 = vec![5, 1, 0, 4];
        v6.extend(
            "2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend(443u16.to_be_bytes());
        every_prefix_is_partial(&v6, request);
        let Ok(Read::Complete(r, n)) = request(&v6) else {
            panic!()
        };
        assert_eq!(n, 22);
        assert_eq!(r.authority().unwrap(), "[2001:db8::1]:443");

        let mut name = vec![5, 1, 0, 3, 11];
        name.extend(b"example.com");
        name.extend(8443u16.to_be_bytes());
        every_prefix_is_partial(&name, request);
        let Ok(Read::Complete(r, n)) = request(&name) else {
            panic!()
        };
        assert_eq!(n, name.len());
        assert_eq!(r.address, Address::Name(b"example.com".to_vec()));
        assert_eq!(r.authority().unwrap(), "example.com:8443");

        // The longest name: 255 bytes, bounded by its length byte.
        let mut long = vec![5, 1, 0, 3, 255];
        long.extend([b'a'; 255]);
        long.extend(443u16.to_be_bytes());
        let Ok(Read::Complete(_, n)) = request(&long) else {
            panic!()
        };
        assert_eq!(n, 262);
    }

    #[test]
    fn a_request_names_its_command_whatever_it_is() {
        for (byte, command) in [
            (1, Command::Connect),
            (2, Command::Bind),
            (3, Command::UdpAssociate),
            (9, Command::Other(9)),
        ] {
            let Ok(Read::Complete(r, _)) = request(&[5, byte, 0, 1, 1, 2, 3, 4, 0, 80]) else {
                panic!()
            };
            assert_eq!(r.command, command);
        }
    }

    #[test]
    fn a_bad_request_is_refused_as_soon_as_its_fault_arrived() {
        assert_eq!(request(&[4]), Err(WireError::Version(4)));
        assert_eq!(request(&[4, 1, 0, 1]), Err(WireError::Version(4)));
        assert_eq!(request(&[5, 1, 1, 1]), Err(WireError::Reserved(1)));
        assert_eq!(request(&[5, 1, 0, 2]), Err(WireError::AddressType(2)));
        assert_eq!(request(&[5, 1, 0, 3, 0]), Err(WireError::EmptyName));
    }

    #[test]
    fn a_name_that_is_not_ascii_has_no_authority() {
        let r = Request {
            command: Command::Connect,
            address: Address::Name("bücher.example".as_bytes().to_vec()),
            port: 443,
        };
        assert_eq!(r.authority(), None);
        let r = Request {
            command: Command::Connect,
            address: Address::Name(vec![0xff, 0xfe]),
            port: 443,
        };
        assert_eq!(r.authority(), None);
    }

    #[test]
    fn answers_are_as_the_rfcs_write_them() {
        assert_eq!(method_selection(USERNAME_PASSWORD), [5, 2]);
        assert_eq!(method_selection(NO_ACCEPTABLE_METHODS), [5, 0xff]);
        assert_eq!(auth_status(true), [1, 0]);
        assert_eq!(auth_status(false), [1, 1]);
        assert_eq!(Reply::NotAllowed.message(), [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
        let codes: Vec<u8> = Reply::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes, (0..=8).collect::<Vec<u8>>());
    }
}
