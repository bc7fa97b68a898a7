//! libvirt's RPC wire format: message framing, the REMOTE and KEEPALIVE programs, and the
//! argument and result layouts of the procedures this crate calls.
//!
//! Layouts follow libvirt's `src/rpc/virnetprotocol.x`, `src/rpc/virkeepaliveprotocol.x` and
//! `src/remote/remote_protocol.x`; procedure numbers are part of libvirt's stable wire ABI.

use crate::xdr::{Decoder, Encoder, XdrDecode, XdrEncode, XdrError};

/// The REMOTE program (virConnect and friends).
pub const REMOTE_PROGRAM: u32 = 0x2000_8086;
pub const REMOTE_PROTOCOL_VERSION: u32 = 1;
/// The KEEPALIVE program: PING and PONG, both with no payload.
pub const KEEPALIVE_PROGRAM: u32 = 0x6b65_6570;
pub const KEEPALIVE_PROTOCOL_VERSION: u32 = 1;
pub const KEEPALIVE_PROC_PING: i32 = 1;
pub const KEEPALIVE_PROC_PONG: i32 = 2;

/// Largest whole message, length word included (VIR_NET_MESSAGE_MAX in libvirt >= 5.0; older
/// daemons used half of it, which this bound also covers).
pub const MESSAGE_MAX: usize = 33_554_432;
/// The length word plus the fixed header.
pub const HEADER_LEN: usize = 4 + 24;
/// Longest string libvirt sends (REMOTE_STRING_MAX).
pub const STRING_MAX: usize = 4_194_304;
/// Longest list of domains, volumes, ... in one reply (REMOTE_DOMAIN_LIST_MAX and friends).
pub const LIST_MAX: usize = 16_384;
/// Largest stream data packet payload libvirt itself sends and accepts everywhere
/// (VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX); bigger packets would break older daemons.
pub const STREAM_CHUNK_MAX: usize = 262_120;
const UUID_LEN: usize = 16;
const NODE_MODEL_LEN: usize = 32;

/// Procedure numbers of the REMOTE program used here.
pub mod procedure {
    pub const CONNECT_OPEN: i32 = 1;
    pub const CONNECT_CLOSE: i32 = 2;
    pub const NODE_GET_INFO: i32 = 6;
    pub const DOMAIN_LOOKUP_BY_NAME: i32 = 23;
    pub const DOMAIN_RESUME: i32 = 28;
    pub const CONNECT_GET_HOSTNAME: i32 = 59;
    pub const AUTH_LIST: i32 = 66;
    pub const STORAGE_POOL_REFRESH: i32 = 83;
    pub const STORAGE_POOL_LOOKUP_BY_NAME: i32 = 84;
    pub const STORAGE_POOL_GET_INFO: i32 = 87;
    pub const STORAGE_VOL_CREATE_XML: i32 = 93;
    pub const STORAGE_VOL_DELETE: i32 = 94;
    pub const STORAGE_VOL_LOOKUP_BY_NAME: i32 = 95;
    pub const STORAGE_VOL_GET_INFO: i32 = 98;
    pub const STORAGE_VOL_GET_XML_DESC: i32 = 99;
    pub const STORAGE_VOL_GET_PATH: i32 = 100;
    pub const NODE_GET_FREE_MEMORY: i32 = 102;
    pub const CONNECT_GET_LIB_VERSION: i32 = 157;
    pub const DOMAIN_CREATE_WITH_FLAGS: i32 = 196;
    pub const STORAGE_VOL_UPLOAD: i32 = 208;
    pub const STORAGE_VOL_DOWNLOAD: i32 = 209;
    pub const DOMAIN_GET_STATE: i32 = 212;
    pub const DOMAIN_UNDEFINE_FLAGS: i32 = 231;
    pub const DOMAIN_DESTROY_FLAGS: i32 = 234;
    pub const DOMAIN_GET_METADATA: i32 = 265;
    pub const CONNECT_LIST_ALL_DOMAINS: i32 = 273;
    pub const STORAGE_POOL_LIST_ALL_VOLUMES: i32 = 282;
    pub const DOMAIN_DEFINE_XML_FLAGS: i32 = 350;
    pub const DOMAIN_INTERFACE_ADDRESSES: i32 = 353;
}

/// virNetMessageType.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Call,
    Reply,
    /// Asynchronous notifications (events, keepalive).
    Message,
    Stream,
    CallWithFds,
    ReplyWithFds,
    StreamHole,
    /// Anything newer; kept so a header always decodes and the reader can skip it.
    Other(u32),
}

impl MessageType {
    pub fn to_wire(self) -> u32 {
        match self {
            Self::Call => 0,
            Self::Reply => 1,
            Self::Message => 2,
            Self::Stream => 3,
            Self::CallWithFds => 4,
            Self::ReplyWithFds => 5,
            Self::StreamHole => 6,
            Self::Other(v) => v,
        }
    }

    pub fn from_wire(v: u32) -> Self {
        match v {
            0 => Self::Call,
            1 => Self::Reply,
            2 => Self::Message,
            3 => Self::Stream,
            4 => Self::CallWithFds,
            5 => Self::ReplyWithFds,
            6 => Self::StreamHole,
            other => Self::Other(other),
        }
    }
}

/// virNetMessageStatus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Error,
    /// Stream packets: more data follows.
    Continue,
    Other(u32),
}

impl Status {
    pub fn to_wire(self) -> u32 {
        match self {
            Self::Ok => 0,
            Self::Error => 1,
            Self::Continue => 2,
            Self::Other(v) => v,
        }
    }

    pub fn from_wire(v: u32) -> Self {
        match v {
            0 => Self::Ok,
            1 => Self::Error,
            2 => Self::Continue,
            other => Self::Other(other),
        }
    }
}

/// virNetMessageHeader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub program: u32,
    pub version: u32,
    pub procedure: i32,
    pub msg_type: MessageType,
    pub serial: u32,
    pub status: Status,
}

impl Header {
    /// A call of the REMOTE program.
    pub fn call(procedure: i32, serial: u32) -> Self {
        Self {
            program: REMOTE_PROGRAM,
            version: REMOTE_PROTOCOL_VERSION,
            procedure,
            msg_type: MessageType::Call,
            serial,
            status: Status::Ok,
        }
    }

    /// A stream packet of the REMOTE program belonging to the call `serial`.
    pub fn stream(procedure: i32, serial: u32, status: Status) -> Self {
        Self {
            program: REMOTE_PROGRAM,
            version: REMOTE_PROTOCOL_VERSION,
            procedure,
            msg_type: MessageType::Stream,
            serial,
            status,
        }
    }

    /// A keepalive PING or PONG (asynchronous message, serial 0).
    pub fn keepalive(procedure: i32) -> Self {
        Self {
            program: KEEPALIVE_PROGRAM,
            version: KEEPALIVE_PROTOCOL_VERSION,
            procedure,
            msg_type: MessageType::Message,
            serial: 0,
            status: Status::Ok,
        }
    }
}

impl XdrEncode for Header {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(self.program);
        enc.put_u32(self.version);
        enc.put_i32(self.procedure);
        enc.put_u32(self.msg_type.to_wire());
        enc.put_u32(self.serial);
        enc.put_u32(self.status.to_wire());
    }
}

impl XdrDecode for Header {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(Self {
            program: dec.get_u32()?,
            version: dec.get_u32()?,
            procedure: dec.get_i32()?,
            msg_type: MessageType::from_wire(dec.get_u32()?),
            serial: dec.get_u32()?,
            status: Status::from_wire(dec.get_u32()?),
        })
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("message length {0} is below the header size")]
    TooShort(usize),
    #[error("message length {0} exceeds the protocol maximum {MESSAGE_MAX}")]
    TooLong(usize),
    #[error("malformed message: {0}")]
    Xdr(#[from] XdrError),
}

/// Checks a message's length word (which counts itself) and returns how many bytes follow it.
/// Called before anything is allocated for the body.
pub fn body_len(length_word: [u8; 4]) -> Result<usize, FrameError> {
    let total = u32::from_be_bytes(length_word) as usize;
    if total < HEADER_LEN {
        return Err(FrameError::TooShort(total));
    }
    if total > MESSAGE_MAX {
        return Err(FrameError::TooLong(total));
    }
    Ok(total - 4)
}

/// Encodes a whole message: length word, header, payload (raw bytes, as stream data is).
pub fn encode_frame(header: &Header, payload: &[u8]) -> Vec<u8> {
    write_frame(header, HEADER_LEN + payload.len(), |enc| {
        enc.put_raw(payload)
    })
}

/// Encodes a whole message whose payload is an XDR value.
pub fn encode_call<T: XdrEncode + ?Sized>(header: &Header, args: &T) -> Vec<u8> {
    write_frame(header, 256, |enc| args.encode(enc))
}

fn write_frame(header: &Header, capacity: usize, payload: impl FnOnce(&mut Encoder)) -> Vec<u8> {
    let mut enc = Encoder::with_buffer(Vec::with_capacity(capacity));
    enc.put_u32(0); // the length word, patched once the size is known
    header.encode(&mut enc);
    payload(&mut enc);
    let mut out = enc.into_inner();
    let total = u32::try_from(out.len()).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&total.to_be_bytes());
    out
}

/// Splits a message body (everything after the length word) into header and payload.
pub fn decode_body(body: &[u8]) -> Result<(Header, &[u8]), FrameError> {
    let mut dec = Decoder::new(body);
    let header = Header::decode(&mut dec)?;
    let payload = &body[body.len() - dec.remaining()..];
    Ok((header, payload))
}

/// Decodes a whole frame, length word included, checking the length word against the bytes.
pub fn decode_frame(frame: &[u8]) -> Result<(Header, &[u8]), FrameError> {
    let Some((word, body)) = frame.split_first_chunk::<4>() else {
        return Err(FrameError::TooShort(frame.len()));
    };
    let len = body_len(*word)?;
    if len != body.len() {
        return Err(FrameError::Xdr(XdrError::Truncated {
            needed: len,
            available: body.len(),
        }));
    }
    decode_body(body)
}

// ---------------------------------------------------------------- shared value types

/// A 16-byte libvirt UUID.
pub type Uuid = [u8; UUID_LEN];

fn put_uuid(enc: &mut Encoder, uuid: &Uuid) {
    enc.put_fixed_opaque(uuid);
}

fn get_uuid(dec: &mut Decoder<'_>) -> Result<Uuid, XdrError> {
    let bytes = dec.get_fixed_opaque(UUID_LEN)?;
    let mut uuid = [0u8; UUID_LEN];
    uuid.copy_from_slice(bytes);
    Ok(uuid)
}

/// Formats a UUID the way libvirt prints it (8-4-4-4-12 lower-case hex).
pub fn uuid_string(uuid: &Uuid) -> String {
    let h = hex::encode(uuid);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl XdrEncode for u32 {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(*self);
    }
}
impl XdrDecode for u32 {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_u32()
    }
}
impl XdrEncode for i32 {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_i32(*self);
    }
}
impl XdrDecode for i32 {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_i32()
    }
}
impl XdrEncode for u64 {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u64(*self);
    }
}
impl XdrDecode for u64 {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_u64()
    }
}
/// `remote_nonnull_string`.
impl XdrEncode for String {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_string(self);
    }
}
impl XdrDecode for String {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_string(STRING_MAX)
    }
}
/// `T *`: optional values, e.g. `remote_string`.
impl<T: XdrEncode> XdrEncode for Option<T> {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_option(self.as_ref(), |e, v| v.encode(e));
    }
}
impl<T: XdrDecode> XdrDecode for Option<T> {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_option(T::decode)
    }
}
/// `T name<MAX>`: every list used here is bounded by [`LIST_MAX`] or less.
impl<T: XdrEncode> XdrEncode for Vec<T> {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(u32::try_from(self.len()).unwrap_or(u32::MAX));
        for item in self {
            item.encode(enc);
        }
    }
}
impl<T: XdrDecode> XdrDecode for Vec<T> {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_array(LIST_MAX, T::decode)
    }
}

/// Declares a plain XDR struct: fields are encoded in order with their own encodings.
macro_rules! xdr_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name { $($(#[$fmeta])* pub $field: $ty),* }

        impl XdrEncode for $name {
            #[allow(unused_variables)]
            fn encode(&self, enc: &mut Encoder) {
                $( self.$field.encode(enc); )*
            }
        }

        impl XdrDecode for $name {
            #[allow(unused_variables)]
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
                Ok(Self { $($field: <$ty as XdrDecode>::decode(dec)?),* })
            }
        }
    };
}

/// `remote_nonnull_domain`: how the protocol names a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub uuid: Uuid,
    /// Positive while running, -1 otherwise.
    pub id: i32,
}

impl Domain {
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.uuid)
    }
}

impl XdrEncode for Domain {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_string(&self.name);
        put_uuid(enc, &self.uuid);
        enc.put_i32(self.id);
    }
}

impl XdrDecode for Domain {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(Self {
            name: dec.get_string(STRING_MAX)?,
            uuid: get_uuid(dec)?,
            id: dec.get_i32()?,
        })
    }
}

/// `remote_nonnull_network`: only ever seen inside error replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    pub name: String,
    pub uuid: Uuid,
}

impl XdrEncode for Network {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_string(&self.name);
        put_uuid(enc, &self.uuid);
    }
}

impl XdrDecode for Network {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(Self {
            name: dec.get_string(STRING_MAX)?,
            uuid: get_uuid(dec)?,
        })
    }
}

/// `remote_nonnull_storage_pool`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoragePool {
    pub name: String,
    pub uuid: Uuid,
}

impl XdrEncode for StoragePool {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_string(&self.name);
        put_uuid(enc, &self.uuid);
    }
}

impl XdrDecode for StoragePool {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(Self {
            name: dec.get_string(STRING_MAX)?,
            uuid: get_uuid(dec)?,
        })
    }
}

xdr_struct! {
    /// `remote_nonnull_storage_vol`.
    pub struct StorageVol {
        pub pool: String,
        pub name: String,
        pub key: String,
    }
}

/// `remote_error`: what the daemon sends instead of a result when a call fails.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemoteError {
    /// virErrorNumber.
    pub code: i32,
    /// virErrorDomain.
    pub domain: i32,
    pub message: Option<String>,
    /// virErrorLevel.
    pub level: i32,
    pub dom: Option<Domain>,
    pub str1: Option<String>,
    pub str2: Option<String>,
    pub str3: Option<String>,
    pub int1: i32,
    pub int2: i32,
    pub net: Option<Network>,
}

impl XdrEncode for RemoteError {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_i32(self.code);
        enc.put_i32(self.domain);
        self.message.encode(enc);
        enc.put_i32(self.level);
        self.dom.encode(enc);
        self.str1.encode(enc);
        self.str2.encode(enc);
        self.str3.encode(enc);
        enc.put_i32(self.int1);
        enc.put_i32(self.int2);
        self.net.encode(enc);
    }
}

impl XdrDecode for RemoteError {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(Self {
            code: dec.get_i32()?,
            domain: dec.get_i32()?,
            message: dec.get()?,
            level: dec.get_i32()?,
            dom: dec.get()?,
            str1: dec.get()?,
            str2: dec.get()?,
            str3: dec.get()?,
            int1: dec.get_i32()?,
            int2: dec.get_i32()?,
            net: dec.get()?,
        })
    }
}

// ---------------------------------------------------------------- procedure arguments and results

xdr_struct! {
    /// `remote_auth_list_ret`: remote_auth_type values (0 none, 1 SASL, 2 polkit).
    pub struct AuthListRet { pub types: Vec<i32> }
}

xdr_struct! {
    /// `remote_connect_open_args`.
    pub struct ConnectOpenArgs { pub name: Option<String>, pub flags: u32 }
}

xdr_struct! {
    pub struct LibVersionRet { pub lib_ver: u64 }
}

xdr_struct! {
    pub struct HostnameRet { pub hostname: String }
}

/// `remote_node_get_info_ret`. `char model[32]` is an XDR fixed array of `char`, and XDR
/// encodes every `char` as a full four-byte int: 128 bytes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfoRet {
    pub model: String,
    /// KiB.
    pub memory: u64,
    pub cpus: i32,
    pub mhz: i32,
    pub nodes: i32,
    pub sockets: i32,
    pub cores: i32,
    pub threads: i32,
}

impl XdrEncode for NodeInfoRet {
    fn encode(&self, enc: &mut Encoder) {
        let bytes = self.model.as_bytes();
        for i in 0..NODE_MODEL_LEN {
            enc.put_i32(i32::from(bytes.get(i).copied().unwrap_or(0)));
        }
        enc.put_u64(self.memory);
        for v in [
            self.cpus,
            self.mhz,
            self.nodes,
            self.sockets,
            self.cores,
            self.threads,
        ] {
            enc.put_i32(v);
        }
    }
}

impl XdrDecode for NodeInfoRet {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        let mut model = Vec::with_capacity(NODE_MODEL_LEN);
        for _ in 0..NODE_MODEL_LEN {
            // a C char: only the low byte carries anything
            model.push(dec.get_i32()?.to_le_bytes()[0]);
        }
        let end = model.iter().position(|b| *b == 0).unwrap_or(model.len());
        model.truncate(end);
        Ok(Self {
            model: String::from_utf8_lossy(&model).into_owned(),
            memory: dec.get_u64()?,
            cpus: dec.get_i32()?,
            mhz: dec.get_i32()?,
            nodes: dec.get_i32()?,
            sockets: dec.get_i32()?,
            cores: dec.get_i32()?,
            threads: dec.get_i32()?,
        })
    }
}

xdr_struct! {
    pub struct FreeMemoryRet { pub free_mem: u64 }
}

xdr_struct! {
    /// Arguments of the `*_list_all_*` procedures without an owner object.
    pub struct ListAllArgs { pub need_results: i32, pub flags: u32 }
}

xdr_struct! {
    pub struct ListAllDomainsRet { pub domains: Vec<Domain>, pub ret: u32 }
}

xdr_struct! {
    /// Arguments that are just a name (`*_lookup_by_name_args`).
    pub struct NameArgs { pub name: String }
}

xdr_struct! {
    /// Results that are just a domain.
    pub struct DomainRet { pub dom: Domain }
}

xdr_struct! {
    /// `remote_domain_define_xml_flags_args`.
    pub struct DefineXmlFlagsArgs { pub xml: String, pub flags: u32 }
}

xdr_struct! {
    /// Arguments that are a domain and flags (create, destroy, undefine, get_state).
    pub struct DomainFlagsArgs { pub dom: Domain, pub flags: u32 }
}

xdr_struct! {
    /// `remote_domain_resume_args`.
    pub struct DomainArgs { pub dom: Domain }
}

xdr_struct! {
    /// `remote_domain_get_state_ret`.
    pub struct DomainStateRet { pub state: i32, pub reason: i32 }
}

xdr_struct! {
    /// `remote_domain_get_metadata_args`; `kind` is virDomainMetadataType.
    pub struct GetMetadataArgs { pub dom: Domain, pub kind: i32, pub uri: Option<String>, pub flags: u32 }
}

xdr_struct! {
    pub struct GetMetadataRet { pub metadata: String }
}

xdr_struct! {
    /// `remote_domain_interface_addresses_args`; `source` is virDomainInterfaceAddressesSource.
    pub struct InterfaceAddressesArgs { pub dom: Domain, pub source: u32, pub flags: u32 }
}

xdr_struct! {
    /// `remote_domain_ip_addr`; `kind` is virIPAddrType (0 IPv4, 1 IPv6).
    pub struct IpAddr { pub kind: i32, pub addr: String, pub prefix: u32 }
}

xdr_struct! {
    /// `remote_domain_interface`.
    pub struct Interface { pub name: String, pub hwaddr: Option<String>, pub addrs: Vec<IpAddr> }
}

xdr_struct! {
    pub struct InterfaceAddressesRet { pub ifaces: Vec<Interface> }
}

xdr_struct! {
    pub struct PoolRet { pub pool: StoragePool }
}

xdr_struct! {
    pub struct PoolArgs { pub pool: StoragePool }
}

xdr_struct! {
    /// `remote_storage_pool_refresh_args`.
    pub struct PoolFlagsArgs { pub pool: StoragePool, pub flags: u32 }
}

xdr_struct! {
    /// `remote_storage_pool_get_info_ret`; `state` is an XDR `unsigned char`, four bytes wide.
    pub struct PoolInfoRet { pub state: u32, pub capacity: u64, pub allocation: u64, pub available: u64 }
}

xdr_struct! {
    pub struct PoolListAllVolumesArgs { pub pool: StoragePool, pub need_results: i32, pub flags: u32 }
}

xdr_struct! {
    pub struct PoolListAllVolumesRet { pub vols: Vec<StorageVol>, pub ret: u32 }
}

xdr_struct! {
    /// `remote_storage_vol_lookup_by_name_args`.
    pub struct VolLookupArgs { pub pool: StoragePool, pub name: String }
}

xdr_struct! {
    pub struct VolRet { pub vol: StorageVol }
}

xdr_struct! {
    /// `remote_storage_vol_create_xml_args`.
    pub struct VolCreateXmlArgs { pub pool: StoragePool, pub xml: String, pub flags: u32 }
}

xdr_struct! {
    /// Arguments that are a volume and flags (delete, get_xml_desc).
    pub struct VolFlagsArgs { pub vol: StorageVol, pub flags: u32 }
}

xdr_struct! {
    /// Arguments that are just a volume (get_path, get_info).
    pub struct VolArgs { pub vol: StorageVol }
}

xdr_struct! {
    /// `remote_storage_vol_get_path_ret`.
    pub struct VolPathRet { pub name: String }
}

xdr_struct! {
    /// `remote_storage_vol_get_info_ret`; `kind` is an XDR `char`, four bytes wide.
    pub struct VolInfoRet { pub kind: i32, pub capacity: u64, pub allocation: u64 }
}

xdr_struct! {
    pub struct XmlRet { pub xml: String }
}

xdr_struct! {
    /// `remote_storage_vol_upload_args` and `remote_storage_vol_download_args`; a zero length
    /// means "to the end".
    pub struct VolTransferArgs { pub vol: StorageVol, pub offset: u64, pub length: u64, pub flags: u32 }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn round_trip<T: XdrEncode + XdrDecode + PartialEq + std::fmt::Debug>(v: T) {
        let bytes = v.to_xdr();
        assert_eq!(bytes.len() % 4, 0, "{v:?} is not a multiple of 4 bytes");
        let back = T::from_xdr(&bytes).unwrap();
        assert_eq!(back, v);
        // every strict prefix must fail cleanly, never panic
        for cut in 0..bytes.len() {
            let _ = T::from_xdr(&bytes[..cut]);
        }
    }

    fn dom() -> Domain {
        Domain {
            name: "vm-1".into(),
            uuid: [7; 16],
            id: -1,
        }
    }

    fn pool() -> StoragePool {
        StoragePool {
            name: "default".into(),
            uuid: [3; 16],
        }
    }

    fn vol() -> StorageVol {
        StorageVol {
            pool: "default".into(),
            name: "disk.qcow2".into(),
            key: "/var/lib/libvirt/images/disk.qcow2".into(),
        }
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(Header::call(procedure::CONNECT_OPEN, 9));
        round_trip(Header::keepalive(KEEPALIVE_PROC_PING));
        round_trip(AuthListRet { types: vec![0, 1] });
        round_trip(ConnectOpenArgs {
            name: Some("qemu:///system".into()),
            flags: 0,
        });
        round_trip(ConnectOpenArgs {
            name: None,
            flags: 1,
        });
        round_trip(LibVersionRet {
            lib_ver: 11_003_000,
        });
        round_trip(HostnameRet {
            hostname: "kvm-1".into(),
        });
        round_trip(NodeInfoRet {
            model: "x86_64".into(),
            memory: 16 << 20,
            cpus: 2,
            mhz: 2400,
            nodes: 1,
            sockets: 1,
            cores: 2,
            threads: 1,
        });
        round_trip(FreeMemoryRet { free_mem: 1 << 30 });
        round_trip(ListAllArgs {
            need_results: 1,
            flags: 0,
        });
        round_trip(ListAllDomainsRet {
            domains: vec![dom(), dom()],
            ret: 2,
        });
        round_trip(NameArgs {
            name: "vm-1".into(),
        });
        round_trip(DomainRet { dom: dom() });
        round_trip(DefineXmlFlagsArgs {
            xml: "<domain/>".into(),
            flags: 0,
        });
        round_trip(DomainFlagsArgs {
            dom: dom(),
            flags: 7,
        });
        round_trip(DomainArgs { dom: dom() });
        round_trip(DomainStateRet {
            state: 1,
            reason: 1,
        });
        round_trip(GetMetadataArgs {
            dom: dom(),
            kind: 2,
            uri: Some("https://example.com/x".into()),
            flags: 0,
        });
        round_trip(GetMetadataRet {
            metadata: "<x/>".into(),
        });
        round_trip(InterfaceAddressesArgs {
            dom: dom(),
            source: 0,
            flags: 0,
        });
        round_trip(InterfaceAddressesRet {
            ifaces: vec![Interface {
                name: "vnet0".into(),
                hwaddr: Some("52:54:00:00:00:01".into()),
                addrs: vec![IpAddr {
                    kind: 0,
                    addr: "10.0.0.2".into(),
                    prefix: 24,
                }],
            }],
        });
        round_trip(PoolRet { pool: pool() });
        round_trip(PoolArgs { pool: pool() });
        round_trip(PoolFlagsArgs {
            pool: pool(),
            flags: 0,
        });
        round_trip(PoolInfoRet {
            state: 2,
            capacity: 10,
            allocation: 5,
            available: 5,
        });
        round_trip(PoolListAllVolumesArgs {
            pool: pool(),
            need_results: 1,
            flags: 0,
        });
        round_trip(PoolListAllVolumesRet {
            vols: vec![vol()],
            ret: 1,
        });
        round_trip(VolLookupArgs {
            pool: pool(),
            name: "disk".into(),
        });
        round_trip(VolRet { vol: vol() });
        round_trip(VolCreateXmlArgs {
            pool: pool(),
            xml: "<volume/>".into(),
            flags: 0,
        });
        round_trip(VolFlagsArgs {
            vol: vol(),
            flags: 0,
        });
        round_trip(VolArgs { vol: vol() });
        round_trip(VolPathRet { name: "/p".into() });
        round_trip(VolInfoRet {
            kind: 0,
            capacity: 1,
            allocation: 1,
        });
        round_trip(XmlRet { xml: "<v/>".into() });
        round_trip(VolTransferArgs {
            vol: vol(),
            offset: 0,
            length: 0,
            flags: 0,
        });
        round_trip(RemoteError {
            code: 42,
            domain: 10,
            message: Some("Domain not found".into()),
            level: 2,
            dom: Some(dom()),
            str1: Some("a".into()),
            str2: None,
            str3: None,
            int1: -1,
            int2: 0,
            net: Some(Network {
                name: "default".into(),
                uuid: [1; 16],
            }),
        });
    }

    #[test]
    fn node_model_is_thirty_two_ints() {
        let v = NodeInfoRet {
            model: "x86_64".into(),
            memory: 1,
            cpus: 1,
            mhz: 1,
            nodes: 1,
            sockets: 1,
            cores: 1,
            threads: 1,
        };
        assert_eq!(v.to_xdr().len(), 32 * 4 + 8 + 6 * 4);
    }

    #[test]
    fn frame_layout_matches_the_protocol() {
        let frame = encode_call(&Header::call(procedure::CONNECT_GET_LIB_VERSION, 5), &());
        assert_eq!(frame.len(), 28);
        assert_eq!(&frame[0..4], &28u32.to_be_bytes());
        assert_eq!(&frame[4..8], &REMOTE_PROGRAM.to_be_bytes());
        assert_eq!(&frame[8..12], &1u32.to_be_bytes());
        assert_eq!(&frame[12..16], &157i32.to_be_bytes());
        assert_eq!(&frame[16..20], &0u32.to_be_bytes());
        assert_eq!(&frame[20..24], &5u32.to_be_bytes());
        assert_eq!(&frame[24..28], &0u32.to_be_bytes());
        let (h, p) = decode_frame(&frame).unwrap();
        assert_eq!(h, Header::call(procedure::CONNECT_GET_LIB_VERSION, 5));
        assert!(p.is_empty());

        let data = encode_frame(
            &Header::stream(procedure::STORAGE_VOL_UPLOAD, 6, Status::Continue),
            b"abc",
        );
        assert_eq!(data.len(), 31, "stream data is raw, not padded");
        let (h, p) = decode_frame(&data).unwrap();
        assert_eq!(h.status, Status::Continue);
        assert_eq!(p, b"abc");
    }

    #[test]
    fn length_word_is_checked_before_allocation() {
        assert_eq!(body_len(27u32.to_be_bytes()), Err(FrameError::TooShort(27)));
        assert_eq!(
            body_len((MESSAGE_MAX as u32 + 1).to_be_bytes()),
            Err(FrameError::TooLong(MESSAGE_MAX + 1))
        );
        assert_eq!(
            body_len(u32::MAX.to_be_bytes()),
            Err(FrameError::TooLong(u32::MAX as usize))
        );
        assert_eq!(body_len(28u32.to_be_bytes()), Ok(24));
    }

    #[test]
    fn error_reply_decodes() {
        let err = RemoteError {
            code: 42,
            domain: 10,
            message: Some("Domain not found: no domain with matching name 'x'".into()),
            level: 2,
            ..RemoteError::default()
        };
        let mut h = Header::call(procedure::DOMAIN_LOOKUP_BY_NAME, 3);
        h.msg_type = MessageType::Reply;
        h.status = Status::Error;
        let frame = encode_call(&h, &err);
        let (hh, payload) = decode_frame(&frame).unwrap();
        assert_eq!(hh.status, Status::Error);
        assert_eq!(RemoteError::from_xdr(payload).unwrap(), err);
    }

    #[test]
    fn uuid_formats_like_libvirt() {
        let mut u = [0u8; 16];
        for (i, b) in u.iter_mut().enumerate() {
            *b = i as u8;
        }
        assert_eq!(uuid_string(&u), "00010203-0405-0607-0809-0a0b0c0d0e0f");
    }

    /// A small xorshift generator: deterministic, no extra crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let seeds: Vec<Vec<u8>> = vec![
            RemoteError {
                code: 1,
                message: Some("m".into()),
                dom: Some(dom()),
                ..RemoteError::default()
            }
            .to_xdr(),
            ListAllDomainsRet {
                domains: vec![dom()],
                ret: 1,
            }
            .to_xdr(),
            InterfaceAddressesRet {
                ifaces: vec![Interface {
                    name: "n".into(),
                    hwaddr: None,
                    addrs: vec![],
                }],
            }
            .to_xdr(),
            encode_call(
                &Header::call(1, 1),
                &ConnectOpenArgs {
                    name: None,
                    flags: 0,
                },
            ),
        ];
        for round in 0..20_000 {
            let mut bytes = if round % 3 == 0 {
                let len = (rng.next() % 96) as usize;
                (0..len).map(|_| rng.next() as u8).collect::<Vec<u8>>()
            } else {
                seeds[round % seeds.len()].clone()
            };
            if !bytes.is_empty() {
                for _ in 0..(rng.next() % 4) {
                    let i = (rng.next() as usize) % bytes.len();
                    bytes[i] = rng.next() as u8;
                }
                let cut = (rng.next() as usize) % (bytes.len() + 1);
                bytes.truncate(cut);
            }
            let _ = RemoteError::from_xdr(&bytes);
            let _ = ListAllDomainsRet::from_xdr(&bytes);
            let _ = InterfaceAddressesRet::from_xdr(&bytes);
            let _ = PoolListAllVolumesRet::from_xdr(&bytes);
            let _ = NodeInfoRet::from_xdr(&bytes);
            let _ = AuthListRet::from_xdr(&bytes);
            let _ = decode_frame(&bytes);
            let _ = decode_body(&bytes);
        }
    }
}
