//! Every decoder must reject malformed input with an error, never a panic or a huge allocation.
//! Run: `cargo +nightly fuzz run decode` from host/libvirt-rpc.
#![no_main]

use libfuzzer_sys::fuzz_target;
use libvirt_rpc::proto::{self, RemoteError};
use libvirt_rpc::xdr::XdrDecode;

fuzz_target!(|data: &[u8]| {
    let _ = proto::decode_frame(data);
    if let Ok((_, payload)) = proto::decode_body(data) {
        let _ = RemoteError::from_xdr(payload);
    }
    let _ = RemoteError::from_xdr(data);
    let _ = proto::AuthListRet::from_xdr(data);
    let _ = proto::NodeInfoRet::from_xdr(data);
    let _ = proto::ListAllDomainsRet::from_xdr(data);
    let _ = proto::InterfaceAddressesRet::from_xdr(data);
    let _ = proto::PoolListAllVolumesRet::from_xdr(data);
    let _ = proto::PoolInfoRet::from_xdr(data);
    let _ = proto::VolInfoRet::from_xdr(data);
    let _ = proto::DomainStateRet::from_xdr(data);
    let _ = proto::GetMetadataRet::from_xdr(data);
    if let Some(word) = data.first_chunk::<4>() {
        let _ = proto::body_len(*word);
    }
});
