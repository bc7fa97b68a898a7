//! One pooled connection per configured host, and the operations of provider.wit's `libvirt`
//! interface on top of it, one method each.
//!
//! Connections are dialled lazily, one dial at a time per host; a dead one (EOF, I/O error,
//! failed keepalive) is replaced on the next call. Every call has a time budget. A caller that
//! gives up abandons only its own call: the reply is dropped by serial when it comes. If the
//! connection then does not answer a PING either, it is wedged and is killed, so the other
//! callers fail once and the next call dials afresh. Probes and URL transfers use fresh
//! connections of their own so they neither wait behind nor slow down the shared one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::error::Error;
use crate::procedures::{
    AddressSource, DomainState, InterfaceAddresses, NodeInfo, PoolInfo, UNDEFINE_ALL, VolumeInfo,
};
use crate::proto::StorageVol;
use crate::ssh::{self, SshTarget};
use crate::transfer::{self, Transfer, UrlGrant};

/// One host the pool may talk to, under the name callers use for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub name: String,
    pub target: SshTarget,
}

/// Time budgets and liveness settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOptions {
    /// Budget of one call, including a dial when one is needed.
    pub call_timeout: Duration,
    /// Budget of a URL-to-volume transfer (dial, download and upload).
    pub transfer_timeout: Duration,
    /// PING a quiet connection this often.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection counts as dead.
    pub keepalive_wait: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(60),
            transfer_timeout: Duration::from_secs(3600),
            keepalive_interval: Duration::from_secs(30),
            keepalive_wait: Duration::from_secs(10),
        }
    }
}

/// `probe-target` of provider.wit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub host: String,
    pub pool: String,
}

/// `probe-result` of provider.wit: filled as far as the probe got.
#[derive(Debug)]
pub struct ProbeResult {
    pub host: String,
    pub address: String,
    pub user: String,
    pub lib_version: Option<u64>,
    pub hostname: Option<String>,
    pub pool: Option<PoolInfo>,
    pub error: Option<Error>,
}

struct HostSlot {
    target: SshTarget,
    /// The shared connection; the lock also serialises dials.
    conn: Mutex<Option<Client>>,
}

/// Connections to every configured host.
pub struct Pool {
    hosts: HashMap<String, Arc<HostSlot>>,
    opts: PoolOptions,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("hosts", &self.hosts.keys().collect::<Vec<_>>())
            .field("opts", &self.opts)
            .finish()
    }
}

impl Pool {
    pub fn new(hosts: impl IntoIterator<Item = HostConfig>, opts: PoolOptions) -> Self {
        let hosts = hosts
            .into_iter()
            .map(|h| {
                (
                    h.name,
                    Arc::new(HostSlot {
                        target: h.target,
                        conn: Mutex::new(None),
                    }),
                )
            })
            .collect();
        Self { hosts, opts }
    }

    pub fn options(&self) -> &PoolOptions {
        &self.opts
    }

    /// Names of the configured hosts.
    pub fn host_names(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(String::as_str)
    }

    fn slot(&self, host: &str) -> Result<&Arc<HostSlot>, Error> {
        self.hosts
            .get(host)
            .ok_or_else(|| Error::UnknownHost(host.to_owned()))
    }

    /// The host's shared connection, dialled when there is none or it died. Waits at most
    /// until `deadline` (for the dial lock as well as for the dial).
    pub async fn client(&self, host: &str, deadline: Instant) -> Result<Client, Error> {
        let slot = self.slot(host)?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut conn = tokio::time::timeout(remaining, slot.conn.lock())
            .await
            .map_err(|_| Error::timeout(format!("waiting to connect to {host}"), remaining))?;
        if let Some(c) = conn.as_ref()
            && c.is_alive()
        {
            return Ok(c.clone());
        }
        if let Some(old) = conn.take() {
            tracing::info!(
                host,
                reason = old.dead_reason().unwrap_or_default(),
                "redialling libvirt"
            );
        }
        let mut target = slot.target.clone();
        target.dial_timeout = target
            .dial_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let client = ssh::dial(&target).await?;
        client.start_keepalive(self.opts.keepalive_interval, self.opts.keepalive_wait);
        *conn = Some(client.clone());
        Ok(client)
    }

    /// Runs `op` on the host's shared connection within `budget`.
    pub async fn call_with_budget<T, F, Fut>(
        &self,
        host: &str,
        what: &str,
        budget: Duration,
        op: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let deadline = Instant::now() + budget;
        let client = self.client(host, deadline).await?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, op(client.clone())).await {
            Ok(result) => result,
            Err(_) => {
                self.check_wedged(host, client);
                Err(Error::timeout(format!("{what} on {host}"), budget))
            }
        }
    }

    async fn call<T, F, Fut>(&self, host: &str, what: &str, op: F) -> Result<T, Error>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.call_with_budget(host, what, self.opts.call_timeout, op)
            .await
    }

    /// After a call ran out of time: a connection that still answers PING is only slow and is
    /// kept; one that does not is killed so nobody else waits on it.
    fn check_wedged(&self, host: &str, client: Client) {
        let wait = self.opts.keepalive_wait;
        let host = host.to_owned();
        tokio::spawn(async move {
            if let Err(e) = client.ping(wait).await {
                tracing::warn!(host, error = %e, "libvirt connection is wedged; closing it");
                client.kill("closed after a call timed out and PING went unanswered");
            }
        });
    }

    // ------------------------------------------------------------ provider.wit `libvirt`

    pub async fn lib_version(&self, host: &str) -> Result<u64, Error> {
        self.call(host, "lib-version", |c| async move {
            c.connect_get_lib_version().await
        })
        .await
    }

    pub async fn hostname(&self, host: &str) -> Result<String, Error> {
        self.call(host, "hostname", |c| async move {
            c.connect_get_hostname().await
        })
        .await
    }

    pub async fn node_info(&self, host: &str) -> Result<NodeInfo, Error> {
        self.call(
            host,
            "node-info",
            |c| async move { c.node_get_info().await },
        )
        .await
    }

    /// Free memory in bytes.
    pub async fn node_free_memory(&self, host: &str) -> Result<u64, Error> {
        self.call(host, "node-free-memory", |c| async move {
            c.node_get_free_memory().await
        })
        .await
    }

    /// Names of every domain, active and inactive.
    pub async fn list_domains(&self, host: &str) -> Result<Vec<String>, Error> {
        self.call(host, "list-domains", |c| async move {
            let doms = c.connect_list_all_domains().await?;
            Ok(doms.into_iter().map(|d| d.name).collect())
        })
        .await
    }

    /// The domain's UUID.
    pub async fn domain_lookup(&self, host: &str, name: &str) -> Result<String, Error> {
        self.call(host, "domain-lookup", |c| async move {
            Ok(c.domain_lookup_by_name(name).await?.uuid_string())
        })
        .await
    }

    pub async fn domain_define_xml(&self, host: &str, xml: &str) -> Result<(), Error> {
        self.call(host, "domain-define-xml", |c| async move {
            c.domain_define_xml_flags(xml, 0).await.map(drop)
        })
        .await
    }

    pub async fn domain_create(&self, host: &str, name: &str) -> Result<(), Error> {
        self.call(host, "domain-create", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            c.domain_create_with_flags(&dom, 0).await.map(drop)
        })
        .await
    }

    pub async fn domain_resume(&self, host: &str, name: &str) -> Result<(), Error> {
        self.call(host, "domain-resume", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            c.domain_resume(&dom).await
        })
        .await
    }

    pub async fn domain_destroy(&self, host: &str, name: &str) -> Result<(), Error> {
        self.call(host, "domain-destroy", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            c.domain_destroy_flags(&dom, 0).await
        })
        .await
    }

    /// Undefines with NVRAM, managed save and snapshot metadata.
    pub async fn domain_undefine(&self, host: &str, name: &str) -> Result<(), Error> {
        self.call(host, "domain-undefine", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            c.domain_undefine_flags(&dom, UNDEFINE_ALL).await
        })
        .await
    }

    pub async fn domain_get_state(&self, host: &str, name: &str) -> Result<DomainState, Error> {
        self.call(host, "domain-get-state", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            Ok(c.domain_get_state(&dom).await?.0)
        })
        .await
    }

    /// The metadata element in namespace `uri`, as XML.
    pub async fn domain_get_metadata(
        &self,
        host: &str,
        name: &str,
        uri: &str,
    ) -> Result<String, Error> {
        self.call(host, "domain-get-metadata", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            c.domain_get_metadata(&dom, uri).await
        })
        .await
    }

    pub async fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> Result<Vec<InterfaceAddresses>, Error> {
        self.call(host, "domain-interface-addresses", |c| async move {
            let dom = c.domain_lookup_by_name(name).await?;
            c.domain_interface_addresses(&dom, source).await
        })
        .await
    }

    pub async fn pool_info(&self, host: &str, pool: &str) -> Result<PoolInfo, Error> {
        self.call(host, "pool-info", |c| async move {
            let p = c.storage_pool_lookup_by_name(pool).await?;
            c.storage_pool_get_info(&p).await
        })
        .await
    }

    pub async fn pool_refresh(&self, host: &str, pool: &str) -> Result<(), Error> {
        self.call(host, "pool-refresh", |c| async move {
            let p = c.storage_pool_lookup_by_name(pool).await?;
            c.storage_pool_refresh(&p).await
        })
        .await
    }

    pub async fn pool_list_volumes(&self, host: &str, pool: &str) -> Result<Vec<String>, Error> {
        self.call(host, "pool-list-volumes", |c| async move {
            let p = c.storage_pool_lookup_by_name(pool).await?;
            let vols = c.storage_pool_list_all_volumes(&p).await?;
            Ok(vols.into_iter().map(|v| v.name).collect())
        })
        .await
    }

    /// The volume's path.
    pub async fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> Result<String, Error> {
        self.call(host, "volume-lookup", |c| async move {
            let v = lookup_volume(&c, pool, name).await?;
            c.storage_vol_get_path(&v).await
        })
        .await
    }

    pub async fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> Result<(), Error> {
        self.call(host, "volume-create-xml", |c| async move {
            let p = c.storage_pool_lookup_by_name(pool).await?;
            c.storage_vol_create_xml(&p, xml, 0).await.map(drop)
        })
        .await
    }

    pub async fn volume_delete(&self, host: &str, pool: &str, name: &str) -> Result<(), Error> {
        self.call(host, "volume-delete", |c| async move {
            let v = lookup_volume(&c, pool, name).await?;
            c.storage_vol_delete(&v).await
        })
        .await
    }

    pub async fn volume_info(
        &self,
        host: &str,
        pool: &str,
        name: &str,
    ) -> Result<VolumeInfo, Error> {
        self.call(host, "volume-info", |c| async move {
            let v = lookup_volume(&c, pool, name).await?;
            c.storage_vol_get_info(&v).await
        })
        .await
    }

    pub async fn volume_xml(&self, host: &str, pool: &str, name: &str) -> Result<String, Error> {
        self.call(host, "volume-xml", |c| async move {
            let v = lookup_volume(&c, pool, name).await?;
            c.storage_vol_get_xml_desc(&v).await
        })
        .await
    }

    /// Replaces the volume's contents with `data` (small payloads: seed ISOs, markers).
    pub async fn volume_upload(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        data: &[u8],
    ) -> Result<(), Error> {
        self.call(host, "volume-upload", |c| async move {
            let v = lookup_volume(&c, pool, name).await?;
            transfer::upload_bytes(&c, &v, data).await.map(drop)
        })
        .await
    }

    /// Reads at most `max_bytes` of the volume.
    pub async fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, Error> {
        self.call(host, "volume-download", |c| async move {
            let v = lookup_volume(&c, pool, name).await?;
            transfer::download_bytes(&c, &v, max_bytes).await
        })
        .await
    }

    /// Streams an http(s) URL into an existing volume on a dedicated connection, hashing on
    /// the fly; fails when `sha256` is given and differs, or past `max_bytes`.
    // The WIT call's six arguments and the grant they are held to.
    #[allow(clippy::too_many_arguments)]
    pub async fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
        grant: &UrlGrant,
    ) -> Result<Transfer, Error> {
        let slot = self.slot(host)?;
        // A refused URL costs no dial either.
        grant.check_url(url)?;
        let budget = self.opts.transfer_timeout;
        let run = async {
            let client = ssh::dial(&slot.target).await?;
            let result = async {
                let v = lookup_volume(&client, pool, name).await?;
                transfer::upload_from_url(&client, &v, url, sha256, max_bytes, grant).await
            }
            .await;
            let _ = client.connect_close().await;
            result
        };
        tokio::time::timeout(budget, run)
            .await
            .map_err(|_| Error::timeout(format!("volume-upload-from-url on {host}"), budget))?
    }

    /// The size of an http(s) URL's body when the server says (HEAD); `url` and its
    /// redirects must be within `grant`.
    pub async fn url_size(&self, url: &str, grant: &UrlGrant) -> Result<Option<u64>, Error> {
        let budget = self.opts.call_timeout;
        tokio::time::timeout(budget, transfer::url_size(url, grant))
            .await
            .map_err(|_| Error::timeout("url-size", budget))?
    }

    /// Probes every target concurrently, each on a fresh connection closed afterwards.
    pub async fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        let mut set = JoinSet::new();
        for (index, t) in targets.iter().enumerate() {
            let slot = self.hosts.get(&t.host).cloned();
            let t = t.clone();
            let budget = self.opts.call_timeout;
            set.spawn(async move { (index, probe_one(t, slot, budget).await) });
        }
        let mut results: Vec<Option<ProbeResult>> = targets.iter().map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            if let Ok((index, r)) = joined
                && let Some(cell) = results.get_mut(index)
            {
                *cell = Some(r);
            }
        }
        results
            .into_iter()
            .zip(targets)
            .map(|(r, t)| {
                r.unwrap_or_else(|| ProbeResult {
                    host: t.host.clone(),
                    address: String::new(),
                    user: String::new(),
                    lib_version: None,
                    hostname: None,
                    pool: None,
                    error: Some(Error::Protocol("probe task failed".into())),
                })
            })
            .collect()
    }
}

async fn lookup_volume(c: &Client, pool: &str, name: &str) -> Result<StorageVol, Error> {
    let p = c.storage_pool_lookup_by_name(pool).await?;
    c.storage_vol_lookup_by_name(&p, name).await
}

async fn probe_one(t: ProbeTarget, slot: Option<Arc<HostSlot>>, budget: Duration) -> ProbeResult {
    let mut r = ProbeResult {
        host: t.host.clone(),
        address: String::new(),
        user: String::new(),
        lib_version: None,
        hostname: None,
        pool: None,
        error: None,
    };
    let Some(slot) = slot else {
        r.error = Some(Error::UnknownHost(t.host));
        return r;
    };
    r.address = slot.target.address.clone();
    r.user = slot.target.user.clone();
    let run = async {
        let client = ssh::dial(&slot.target).await?;
        let steps = async {
            r.lib_version = Some(client.connect_get_lib_version().await?);
            r.hostname = Some(client.connect_get_hostname().await?);
            let p = client.storage_pool_lookup_by_name(&t.pool).await?;
            r.pool = Some(client.storage_pool_get_info(&p).await?);
            Ok::<(), Error>(())
        }
        .await;
        let _ = client.connect_close().await;
        steps
    };
    match tokio::time::timeout(budget, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => r.error = Some(e),
        Err(_) => r.error = Some(Error::timeout(format!("probe of {}", r.host), budget)),
    }
    r
}
