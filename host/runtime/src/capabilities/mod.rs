//! One module per capability: the backend trait, its real and simulated implementations, and
//! the bindings' host functions that check the grant, open the `<capability>.<call>` span,
//! record mutating calls as plan steps, and call the backend.
//!
//! A capability with backends is a directory: `mod.rs` the trait and the types it speaks,
//! `host.rs` the host functions, `real.rs` and `sim.rs` the backends. The host functions work
//! on the call's state, which holds the [`Backends`], so they sit above the trait in a file of
//! their own; the backends name the trait and nothing of a call.

pub mod clock;
pub mod credentials;
pub mod http;
pub mod kube;
pub mod libvirt;
pub mod lock;
pub mod log;
pub mod tape;

use std::sync::Arc;

/// The backends a set of providers runs against: all real, or all simulated (a dry-run).
#[derive(Clone)]
pub struct Backends {
    pub clock: Arc<dyn clock::ClockBackend>,
    pub kube: Arc<dyn kube::KubeBackend>,
    pub http: Arc<dyn http::HttpBackend>,
    pub libvirt: Arc<dyn libvirt::LibvirtBackend>,
}

impl Backends {
    /// The real backends: the system clock, the cluster from the kubeconfig or in-cluster
    /// config (connected on first use), HTTP with Google Application Default Credentials
    /// (discovered on first use), and the libvirt capability as built.
    pub fn real() -> Self {
        Self {
            clock: Arc::new(clock::SystemClock::new()),
            kube: Arc::new(kube::real::RealKube::new()),
            http: Arc::new(http::real::RealHttp::new(
                http::google_auth::GoogleAuth::discover(),
            )),
            libvirt: Arc::new(libvirt::real::RealLibvirt::default()),
        }
    }

    /// Backends for calls that are granted nothing (describe): nothing to connect, nothing
    /// built beyond a clock, so such a call costs only the sandbox.
    pub fn inert() -> Self {
        Self {
            clock: Arc::new(clock::SystemClock::new()),
            kube: Arc::new(kube::real::RealKube::new()),
            http: Arc::new(http::UnavailableHttp),
            libvirt: Arc::new(libvirt::UnavailableLibvirt),
        }
    }
}
