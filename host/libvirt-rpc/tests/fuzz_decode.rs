//! The stable, bounded counterpart of the nightly cargo-fuzz target (`fuzz/`): every decoder
//! of what the daemon sends, on arbitrary bytes, word soups that reach past the first length
//! check, and mutated encodings of real values. No input panics; a decoder allocates at most
//! [`BYTES_PER_INPUT_BYTE`] bytes per input byte (plus [`BASE_BYTES`]); a length or count
//! larger than the input left is refused before anything is allocated; whatever decodes
//! re-encodes to something that decodes to the same value.
//!
//! `EGRESS_FUZZ_CASES=100000 cargo test -p libvirt-rpc --test fuzz_decode -- --nocapture`
//! runs longer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_fuzz::check;
use libvirt_rpc::proto::{
    self, AuthListRet, Domain, DomainRet, DomainStateRet, FreeMemoryRet, GetMetadataRet,
    HostnameRet, Interface, InterfaceAddressesRet, IpAddr, LibVersionRet, ListAllDomainsRet,
    Network, NodeInfoRet, PoolInfoRet, PoolListAllVolumesRet, PoolRet, RemoteError, StoragePool,
    StorageVol, VolInfoRet, VolPathRet, VolRet, XmlRet,
};
use libvirt_rpc::xdr::{Decoder, XdrDecode, XdrEncode, XdrError};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::fmt::Debug;
use std::sync::Mutex;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The counters are process-wide: the targets take turns, so each measures only itself.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The widest item a list holds (`Interface`, `StorageVol`: three `String`s or vectors, 72
/// bytes) takes at least four bytes on the wire, and a list inside an item may be sized before
/// the item fails: 18 + 8 bytes per input byte at worst, and the strings' own bytes.
const BYTES_PER_INPUT_BYTE: usize = 32;
const BASE_BYTES: usize = 1024;

/// What `f` allocates: fresh allocations and the growth of reallocations. The counters are
/// the process's, and the test harness's own thread allocates as a test ends while the next
/// one may be measuring (seen once in a full run: 1,216 bytes "for 4 input bytes", which
/// the same seed did not repeat). A decoder allocates the same on every run of one input,
/// and another thread's allocation only adds to it: so `f` runs until two measurements
/// agree, at most three times, and the least is what it allocated.
fn allocated_during<R>(f: impl Fn() -> R) -> (R, usize) {
    let once = || {
        let region = Region::new(GLOBAL);
        let out = f();
        let stats = region.change();
        let grown = usize::try_from(stats.bytes_reallocated.max(0)).unwrap_or(0);
        (out, stats.bytes_allocated + grown)
    };
    let (_, first) = once();
    let (out, second) = once();
    if first == second {
        return (out, second);
    }
    let (out, third) = once();
    (out, first.min(second).min(third))
}

/// What a value keeps through re-encoding: all of it, but for the node model, a C `char[32]`
/// read lossily (a byte that is not UTF-8 becomes U+FFFD, three bytes, which 32 cannot hold).
trait Kept {
    fn kept(&self) -> Self;
}

macro_rules! kept_whole {
    ($($t:ty),* $(,)?) => { $( impl Kept for $t { fn kept(&self) -> Self { self.clone() } } )* };
}

kept_whole!(
    RemoteError,
    AuthListRet,
    LibVersionRet,
    HostnameRet,
    FreeMemoryRet,
    ListAllDomainsRet,
    DomainRet,
    DomainStateRet,
    GetMetadataRet,
    InterfaceAddressesRet,
    PoolRet,
    PoolInfoRet,
    PoolListAllVolumesRet,
    VolRet,
    VolPathRet,
    VolInfoRet,
    XmlRet,
);

impl Kept for NodeInfoRet {
    fn kept(&self) -> Self {
        Self {
            model: String::new(),
            ..self.clone()
        }
    }
}

fn check_decoder<T>(name: &str, bytes: &[u8]) -> Result<(), TestCaseError>
where
    T: XdrDecode + XdrEncode + PartialEq + Debug + Kept,
{
    let (decoded, allocated) = allocated_during(|| T::from_xdr(bytes));
    let budget = BASE_BYTES + BYTES_PER_INPUT_BYTE * bytes.len();
    prop_assert!(
        allocated <= budget,
        "{name} allocated {allocated} bytes for {} input bytes",
        bytes.len()
    );
    if let Ok(value) = decoded {
        let again = T::from_xdr(&value.to_xdr()).map(|v| v.kept());
        prop_assert_eq!(again, Ok(value.kept()), "{} re-encoded", name);
    }
    Ok(())
}

macro_rules! every_decoder {
    ($bytes:expr; $($t:ty),* $(,)?) => {{
        $( check_decoder::<$t>(stringify!($t), $bytes)?; )*
    }};
}

/// Every result the client decodes, the error record, and the framing.
fn decode_everything(bytes: &[u8]) -> Result<(), TestCaseError> {
    every_decoder!(bytes;
        RemoteError, AuthListRet, LibVersionRet, HostnameRet, NodeInfoRet, FreeMemoryRet,
        ListAllDomainsRet, DomainRet, DomainStateRet, GetMetadataRet, InterfaceAddressesRet,
        PoolRet, PoolInfoRet, PoolListAllVolumesRet, VolRet, VolPathRet, VolInfoRet, XmlRet,
    );
    let (_, allocated) = allocated_during(|| {
        let _ = proto::decode_frame(bytes);
        if let Ok((_, payload)) = proto::decode_body(bytes) {
            let _ = RemoteError::from_xdr(payload);
        }
        if let Some(word) = bytes.first_chunk::<4>() {
            let _ = proto::body_len(*word);
        }
    });
    prop_assert!(
        allocated <= BASE_BYTES + BYTES_PER_INPUT_BYTE * bytes.len(),
        "framing allocated {allocated} bytes for {} input bytes",
        bytes.len()
    );
    if let Ok((header, payload)) = proto::decode_frame(bytes) {
        let frame = proto::encode_frame(&header, payload);
        prop_assert_eq!(proto::decode_frame(&frame), Ok((header, payload)));
    }
    Ok(())
}

/// Words that steer a decoder somewhere: booleans, small counts, the protocol's limits and
/// one past them, and the largest values a length can claim.
fn word() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..4,
        1 => Just(proto::REMOTE_PROGRAM),
        1 => Just(proto::LIST_MAX as u32),
        1 => Just(proto::LIST_MAX as u32 + 1),
        1 => Just(proto::STRING_MAX as u32),
        1 => Just(proto::STRING_MAX as u32 + 1),
        1 => Just(proto::MESSAGE_MAX as u32),
        1 => Just(u32::MAX),
        1 => Just(0x8000_0000),
        2 => 4u32..64,
        2 => any::<u32>(),
    ]
}

fn word_soup() -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::vec(word(), 0..48), 0usize..4).prop_map(|(words, tail)| {
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        out.extend(std::iter::repeat_n(b'x', tail));
        out
    })
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9-]{0,12}",
        1 => proptest::collection::vec(any::<char>(), 0..12).prop_map(|c| c.into_iter().collect()),
    ]
}

fn uuid() -> impl Strategy<Value = [u8; 16]> {
    any::<[u8; 16]>()
}

fn domain() -> impl Strategy<Value = Domain> {
    (text(), uuid(), any::<i32>()).prop_map(|(name, uuid, id)| Domain { name, uuid, id })
}

fn vol() -> impl Strategy<Value = StorageVol> {
    (text(), text(), text()).prop_map(|(pool, name, key)| StorageVol { pool, name, key })
}

fn interface() -> impl Strategy<Value = Interface> {
    let addr = (any::<i32>(), text(), any::<u32>()).prop_map(|(kind, addr, prefix)| IpAddr {
        kind,
        addr,
        prefix,
    });
    (
        text(),
        proptest::option::of(text()),
        proptest::collection::vec(addr, 0..3),
    )
        .prop_map(|(name, hwaddr, addrs)| Interface {
            name,
            hwaddr,
            addrs,
        })
}

fn remote_error() -> impl Strategy<Value = RemoteError> {
    let pool = (text(), uuid()).prop_map(|(name, uuid)| Network { name, uuid });
    (
        (
            any::<i32>(),
            any::<i32>(),
            proptest::option::of(text()),
            any::<i32>(),
        ),
        proptest::option::of(domain()),
        (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
        ),
        (any::<i32>(), any::<i32>(), proptest::option::of(pool)),
    )
        .prop_map(
            |((code, domain, message, level), dom, (str1, str2, str3), (int1, int2, net))| {
                RemoteError {
                    code,
                    domain,
                    message,
                    level,
                    dom,
                    str1,
                    str2,
                    str3,
                    int1,
                    int2,
                    net,
                }
            },
        )
}

/// The encoding of a value the daemon could send.
fn encoding() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        remote_error().prop_map(|v| v.to_xdr()),
        proptest::collection::vec(domain(), 0..4).prop_map(|domains| ListAllDomainsRet {
            domains,
            ret: 0
        }
        .to_xdr()),
        proptest::collection::vec(interface(), 0..4)
            .prop_map(|ifaces| InterfaceAddressesRet { ifaces }.to_xdr()),
        proptest::collection::vec(vol(), 0..4).prop_map(|vols| PoolListAllVolumesRet {
            vols,
            ret: 0
        }
        .to_xdr()),
        proptest::collection::vec(any::<i32>(), 0..4)
            .prop_map(|types| AuthListRet { types }.to_xdr()),
        text().prop_map(|metadata| GetMetadataRet { metadata }.to_xdr()),
        (text(), uuid()).prop_map(|(name, uuid)| PoolRet {
            pool: StoragePool { name, uuid }
        }
        .to_xdr()),
        ("[ -~]{0,40}", any::<u64>()).prop_map(|(model, memory)| NodeInfoRet {
            model,
            memory,
            cpus: 2,
            mhz: 2400,
            nodes: 1,
            sockets: 1,
            cores: 2,
            threads: 1,
        }
        .to_xdr()),
        (any::<u32>(), remote_error()).prop_map(|(serial, e)| {
            let header = proto::Header::call(proto::procedure::DOMAIN_GET_STATE, serial);
            proto::encode_frame(&header, &e.to_xdr())
        }),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    /// A length or count word set to a value past what is left.
    Forge {
        word: usize,
        value: u32,
    },
    Truncate(usize),
    Append(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), word()).prop_map(|(word, value)| Mutation::Forge { word, value }),
        any::<usize>().prop_map(Mutation::Truncate),
        proptest::collection::vec(any::<u8>(), 1..8).prop_map(Mutation::Append),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        match m {
            Mutation::Flip { at, bit } if !bytes.is_empty() => {
                let i = at % bytes.len();
                bytes[i] ^= 1 << bit;
            }
            Mutation::Forge { word, value } if bytes.len() >= 4 => {
                let i = (word % (bytes.len() / 4)) * 4;
                bytes[i..i + 4].copy_from_slice(&value.to_be_bytes());
            }
            Mutation::Truncate(n) if !bytes.is_empty() => {
                let n = n % bytes.len();
                bytes.truncate(n);
            }
            Mutation::Append(extra) => bytes.extend_from_slice(extra),
            _ => {}
        }
    }
    bytes
}

#[test]
fn decoders_on_arbitrary_bytes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    check(
        "libvirt_rpc.decode.bytes",
        3000,
        proptest::collection::vec(any::<u8>(), 0..600),
        |bytes| decode_everything(&bytes),
    );
}

#[test]
fn decoders_on_word_soups() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    check("libvirt_rpc.decode.words", 1000, word_soup(), |bytes| {
        decode_everything(&bytes)
    });
}

#[test]
fn decoders_on_mutated_encodings() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    check(
        "libvirt_rpc.decode.mutated",
        3000,
        (encoding(), proptest::collection::vec(mutation(), 0..3)),
        |(bytes, mutations)| decode_everything(&mutate(bytes, &mutations)),
    );
}

/// Values round-trip exactly through their encoding.
#[test]
fn values_round_trip() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    check(
        "libvirt_rpc.decode.round_trip",
        1000,
        (
            remote_error(),
            proptest::collection::vec(interface(), 0..4),
            proptest::collection::vec(vol(), 0..4),
        ),
        |(e, ifaces, vols)| {
            prop_assert_eq!(RemoteError::from_xdr(&e.to_xdr()), Ok(e));
            let ifaces = InterfaceAddressesRet { ifaces };
            prop_assert_eq!(
                InterfaceAddressesRet::from_xdr(&ifaces.to_xdr()),
                Ok(ifaces)
            );
            let vols = PoolListAllVolumesRet { vols, ret: 7 };
            prop_assert_eq!(PoolListAllVolumesRet::from_xdr(&vols.to_xdr()), Ok(vols));
            Ok(())
        },
    );
}

/// A length or count beyond the bytes left is refused, and nothing is allocated for it.
#[test]
fn a_length_past_the_input_is_refused_before_allocating() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    check(
        "libvirt_rpc.decode.forged_length",
        3000,
        (
            word(),
            proptest::collection::vec(any::<u8>(), 0..64),
            prop_oneof![Just(0usize), Just(16), Just(proto::STRING_MAX)],
        ),
        |(claimed, rest, max)| {
            let mut bytes = claimed.to_be_bytes().to_vec();
            bytes.extend_from_slice(&rest);
            let claimed = claimed as usize;
            let padded = claimed.div_ceil(4) * 4;
            let (opaque, allocated) =
                allocated_during(|| Decoder::new(&bytes).get_opaque(max).map(<[u8]>::len));
            if claimed > max {
                prop_assert_eq!(opaque, Err(XdrError::TooLong { len: claimed, max }));
            } else if padded > rest.len() {
                prop_assert!(
                    matches!(opaque, Err(XdrError::Truncated { .. })),
                    "{opaque:?}"
                );
            } else {
                prop_assert_eq!(opaque, Ok(claimed));
            }
            prop_assert_eq!(allocated, 0, "get_opaque allocates nothing");
            let (string, allocated) = allocated_during(|| Decoder::new(&bytes).get_string(max));
            if claimed > max || padded > rest.len() {
                prop_assert!(string.is_err());
                prop_assert_eq!(allocated, 0, "a refused string allocates nothing");
            } else if let Ok(s) = &string {
                // The counter sees the decoders' allocations at all.
                prop_assert!(
                    allocated >= s.len(),
                    "{allocated} bytes counted for {}",
                    s.len()
                );
            }
            let (array, allocated) =
                allocated_during(|| Decoder::new(&bytes).get_array(max, |d| d.get_u32()));
            if claimed > max || claimed.saturating_mul(4) > rest.len() {
                prop_assert!(array.is_err());
                prop_assert_eq!(allocated, 0, "a refused array allocates nothing");
            }
            Ok(())
        },
    );
}
