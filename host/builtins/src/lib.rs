#![doc = include_str!("../README.md")]

/// The `kubernetes` provider.
pub const KUBERNETES: &[u8] = include_bytes!(env!("EGRESS_MODULE_PROVIDER_KUBERNETES"));

/// The `kvm` and `kvm2` providers (one module, two metadata namespaces).
pub const LIBVIRT: &[u8] = include_bytes!(env!("EGRESS_MODULE_PROVIDER_LIBVIRT"));

/// The `gcp` provider.
pub const GCP: &[u8] = include_bytes!(env!("EGRESS_MODULE_PROVIDER_GCP"));

/// The module serving a built-in type, if any.
pub fn module_for_type(type_name: &str) -> Option<&'static [u8]> {
    match type_name {
        "kubernetes" => Some(KUBERNETES),
        "kvm" | "kvm2" => Some(LIBVIRT),
        "gcp" => Some(GCP),
        _ => None,
    }
}
