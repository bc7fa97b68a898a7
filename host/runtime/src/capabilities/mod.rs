//! One module per capability: the backend trait, its real and simulated implementations, and
//! the bindings' host functions that check the grant, open the `<capability>.<call>` span,
//! record mutating calls as plan steps, and call the backend.

pub mod clock;
pub mod credentials;
pub mod gce_sim;
pub mod google_auth;
pub mod http;
pub mod http_real;
pub mod kube;
pub mod kube_sim;
pub mod libvirt;
pub mod libvirt_real;
pub mod libvirt_sim;
pub mod lock;
pub mod log;

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
            kube: Arc::new(kube::RealKube::new()),
            http: Arc::new(http_real::RealHttp::new(google_auth::GoogleAuth::discover())),
            libvirt: Arc::new(libvirt_real::RealLibvirt::default()),
        }
    }

    /// Backends for calls that are granted nothing (describe): nothing to connect, nothing
    /// built beyond a clock, so such a call costs only the sandbox.
    pub fn inert() -> Self {
        Self {
            clock: Arc::new(clock::SystemClock::new()),
            kube: Arc::new(kube::RealKube::new()),
            http: Arc::new(http::UnavailableHttp),
            libvirt: Arc::new(libvirt::UnavailableLibvirt),
        }
    }
}
