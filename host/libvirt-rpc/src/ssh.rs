//! Reaching libvirtd through SSH: key authentication, host key pinned by a known_hosts file,
//! then one `direct-streamlocal@openssh.com` channel to libvirt's unix socket, the same path
//! `ssh -L sock:/var/run/libvirt/libvirt-sock` takes, with no remote command involved.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use russh::client;
use russh::keys::{PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};

use crate::client::Client;
use crate::error::{DialStage, Error};

pub const DEFAULT_SOCKET: &str = "/var/run/libvirt/libvirt-sock";
pub const DEFAULT_URI: &str = "qemu:///system";
const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_128_GCM,
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_128_CTR,
];
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(20);

/// How the server's host key is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyPolicy {
    /// The key must be listed for this host (as `host`, or `[host]:port` off port 22) in the
    /// file, which OpenSSH's `ssh-keyscan` and `ssh` write.
    KnownHosts(PathBuf),
    /// Any key is accepted. Every dial logs a warning: this defeats the point of SSH.
    Insecure,
}

/// Where and how to reach one host's libvirtd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// `host:port`, or `host` for port 22.
    pub address: String,
    pub user: String,
    /// OpenSSH private key, read on every dial so a rotated key needs no restart.
    pub key_file: PathBuf,
    pub host_key: HostKeyPolicy,
    /// libvirt's socket on the remote host.
    pub socket_path: String,
    /// The libvirt URI opened on that socket.
    pub uri: String,
    /// Budget of a whole dial, all stages together.
    pub dial_timeout: Duration,
}

impl SshTarget {
    pub fn new(
        address: impl Into<String>,
        user: impl Into<String>,
        key_file: impl Into<PathBuf>,
        host_key: HostKeyPolicy,
    ) -> Self {
        Self {
            address: address.into(),
            user: user.into(),
            key_file: key_file.into(),
            host_key,
            socket_path: DEFAULT_SOCKET.to_owned(),
            uri: DEFAULT_URI.to_owned(),
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
        }
    }

    /// Splits `address` into host and port (22 when absent); accepts `[v6]:port`.
    pub fn host_port(&self) -> Result<(String, u16), Error> {
        let a = self.address.trim();
        let bad = || {
            Error::dial(
                DialStage::Tcp,
                format!("address {a:?} is not HOST or HOST:PORT"),
            )
        };
        if let Some(rest) = a.strip_prefix('[') {
            let (host, tail) = rest.split_once(']').ok_or_else(bad)?;
            let port = match tail.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad())?,
                None if tail.is_empty() => 22,
                None => return Err(bad()),
            };
            return Ok((host.to_owned(), port));
        }
        match a.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => {
                Ok((host.to_owned(), port.parse().map_err(|_| bad())?))
            }
            _ if a.is_empty() => Err(bad()),
            _ => Ok((a.to_owned(), 22)),
        }
    }
}

/// One stage of a dial and how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRecord {
    pub stage: DialStage,
    pub elapsed: Duration,
    /// `None` when the stage succeeded.
    pub error: Option<String>,
}

/// What a dial went through, stage by stage (for diagnostics).
#[derive(Debug, Clone, Default)]
pub struct DialTrace {
    pub stages: Vec<StageRecord>,
    current: Option<(DialStage, Instant)>,
}

impl DialTrace {
    fn begin(&mut self, stage: DialStage) {
        self.current = Some((stage, Instant::now()));
    }

    fn end(&mut self, error: Option<String>) {
        if let Some((stage, started)) = self.current.take() {
            self.stages.push(StageRecord {
                stage,
                elapsed: started.elapsed(),
                error,
            });
        }
    }

    /// Closes the running stage with `outcome`, turning its error into a staged dial error.
    fn finish<T>(&mut self, outcome: Result<T, String>) -> Result<T, Error> {
        let stage = self.current.map(|(s, _)| s).unwrap_or(DialStage::Tcp);
        match outcome {
            Ok(v) => {
                self.end(None);
                Ok(v)
            }
            Err(message) => {
                self.end(Some(message.clone()));
                Err(Error::dial(stage, message))
            }
        }
    }
}

/// Checks the server's key during the handshake and remembers why it refused one.
struct HostKeyCheck {
    /// Keys known_hosts lists for this host; `None` accepts anything.
    expected: Option<Vec<PublicKey>>,
    host_port: String,
    refusal: Arc<Mutex<Option<String>>>,
    /// How long the check took, for the dial trace.
    checked_in: Arc<Mutex<Option<Duration>>>,
}

impl client::Handler for HostKeyCheck {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let started = Instant::now();
        let verdict = self.verdict(offered);
        *self.checked_in.lock().unwrap_or_else(|p| p.into_inner()) = Some(started.elapsed());
        Ok(verdict)
    }
}

impl HostKeyCheck {
    fn verdict(&self, offered: &PublicKeyOrCertificate) -> bool {
        let Some(expected) = &self.expected else {
            return true;
        };
        let key = match offered {
            PublicKeyOrCertificate::PublicKey { key, .. } => key,
            PublicKeyOrCertificate::Certificate(_) => {
                self.refuse("the server offered a certificate; only plain host keys are pinned");
                return false;
            }
        };
        if expected.iter().any(|k| k.key_data() == key.key_data()) {
            return true;
        }
        let fingerprint = key.fingerprint(Default::default());
        self.refuse(&if expected.is_empty() {
            format!(
                "no known_hosts entry for {}; the server offered {fingerprint}",
                self.host_port
            )
        } else {
            format!(
                "host key for {} does not match known_hosts; the server offered {fingerprint}",
                self.host_port
            )
        });
        false
    }

    fn refuse(&self, why: &str) {
        *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_owned());
    }
}

/// Dials `target` and opens libvirt on it, within `target.dial_timeout`.
pub async fn dial(target: &SshTarget) -> Result<Client, Error> {
    let mut trace = DialTrace::default();
    dial_traced(target, &mut trace).await
}

/// Like [`dial`], recording each stage's duration and outcome in `trace`.
pub async fn dial_traced(target: &SshTarget, trace: &mut DialTrace) -> Result<Client, Error> {
    let budget = target.dial_timeout;
    let outcome = tokio::time::timeout(budget, dial_stages(target, trace)).await;
    match outcome {
        Ok(result) => result,
        Err(_) => {
            let stage = trace.current.map(|(s, _)| s).unwrap_or(DialStage::Tcp);
            let message = format!("timed out after {}ms", budget.as_millis());
            trace.end(Some(message.clone()));
            Err(Error::DialTimeout { stage, message })
        }
    }
}

async fn dial_stages(target: &SshTarget, trace: &mut DialTrace) -> Result<Client, Error> {
    trace.begin(DialStage::Credentials);
    let creds = load_credentials(target).await;
    let (key, expected_keys, host, port) = trace.finish(creds)?;

    trace.begin(DialStage::Tcp);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("connect {}: {e}", target.address));
    let tcp = trace.finish(tcp)?;
    // small RPC frames must not wait for Nagle
    let _ = tcp.set_nodelay(true);

    trace.begin(DialStage::Handshake);
    let refusal = Arc::new(Mutex::new(None));
    let checked_in = Arc::new(Mutex::new(None));
    let handler = HostKeyCheck {
        checked_in: checked_in.clone(),
        expected: expected_keys,
        host_port: if port == 22 {
            host.clone()
        } else {
            format!("[{host}]:{port}")
        },
        refusal: refusal.clone(),
    };
    let config = Arc::new(client::Config {
        nodelay: true,
        // large windows keep bulk uploads from stalling on window adjustments
        window_size: 8 * 1024 * 1024,
        preferred: russh::Preferred {
            // AES-GCM runs on the CPU's AES instructions: bulk volume uploads are
            // cipher-bound, and it is what OpenSSH itself picks when AES-NI is present
            cipher: std::borrow::Cow::Borrowed(CIPHERS),
            ..russh::Preferred::default()
        },
        ..client::Config::default()
    });
    let handshake = client::connect_stream(config, tcp, handler).await;
    let mut ssh_conn = match handshake {
        Ok(s) => {
            trace.finish(Ok(()))?;
            // the key was checked inside the handshake; record that step on its own
            let took = checked_in.lock().unwrap_or_else(|p| p.into_inner()).take();
            trace.stages.push(StageRecord {
                stage: DialStage::HostKey,
                elapsed: took.unwrap_or_default(),
                error: None,
            });
            s
        }
        Err(e) => {
            let refused = refusal.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(why) = refused {
                // the refusal happened inside the handshake; report it as its own stage
                trace.end(None);
                trace.begin(DialStage::HostKey);
                return trace.finish(Err(why));
            }
            return trace.finish(Err(format!("ssh handshake: {e}")));
        }
    };

    trace.begin(DialStage::Auth);
    let auth = async {
        let hash = if key.algorithm().is_rsa() {
            ssh_conn
                .best_supported_rsa_hash()
                .await
                .map_err(|e| format!("negotiating the RSA signature hash: {e}"))?
                .flatten()
        } else {
            None
        };
        let result = ssh_conn
            .authenticate_publickey(
                target.user.clone(),
                PrivateKeyWithHashAlg::new(Arc::new(key), hash),
            )
            .await
            .map_err(|e| format!("public key authentication: {e}"))?;
        if result.success() {
            Ok(())
        } else {
            Err(format!(
                "the server refused the key from {} for user {:?}",
                target.key_file.display(),
                target.user
            ))
        }
    }
    .await;
    trace.finish(auth)?;

    trace.begin(DialStage::Channel);
    let channel = ssh_conn
        .channel_open_direct_streamlocal(target.socket_path.clone())
        .await
        .map_err(|e| format!("opening a channel to {}: {e}", target.socket_path));
    let channel = trace.finish(channel)?;

    trace.begin(DialStage::LibvirtOpen);
    let client = Client::with_transport(channel.into_stream(), Some(Box::new(ssh_conn)));
    let opened = client
        .handshake(&target.uri)
        .await
        .map_err(|e| format!("opening {}: {e}", target.uri));
    trace.finish(opened)?;
    Ok(client)
}

type Credentials = (russh::keys::PrivateKey, Option<Vec<PublicKey>>, String, u16);

async fn load_credentials(target: &SshTarget) -> Result<Credentials, String> {
    let (host, port) = target.host_port().map_err(|e| e.to_string())?;
    let text = tokio::fs::read_to_string(&target.key_file)
        .await
        .map_err(|e| format!("reading {}: {e}", target.key_file.display()))?;
    // the parser's error never echoes the key, only what kind of problem it found
    let key = russh::keys::decode_secret_key(&text, None)
        .map_err(|e| format!("parsing the key in {}: {e}", target.key_file.display()))?;
    drop(text);
    let expected = match &target.host_key {
        HostKeyPolicy::Insecure => {
            tracing::warn!(
                address = %target.address,
                "host key checking is disabled: any server can impersonate this host"
            );
            None
        }
        HostKeyPolicy::KnownHosts(path) => {
            // russh treats a missing file as empty; a missing file is a configuration error
            tokio::fs::metadata(path)
                .await
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            let keys = russh::keys::known_hosts::known_host_keys_path(&host, port, path)
                .map_err(|e| format!("parsing {}: {e}", path.display()))?;
            Some(keys.into_iter().map(|(_, k)| k).collect())
        }
    };
    Ok((key, expected, host, port))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn target(address: &str) -> SshTarget {
        SshTarget::new(address, "root", "/nonexistent", HostKeyPolicy::Insecure)
    }

    #[test]
    fn addresses_parse() {
        assert_eq!(
            target("10.0.0.1:2222").host_port().unwrap(),
            ("10.0.0.1".into(), 2222)
        );
        assert_eq!(target("kvm-1").host_port().unwrap(), ("kvm-1".into(), 22));
        assert_eq!(
            target("[::1]:2200").host_port().unwrap(),
            ("::1".into(), 2200)
        );
        assert_eq!(target("[::1]").host_port().unwrap(), ("::1".into(), 22));
        assert!(target("h:notaport").host_port().is_err());
        assert!(target("").host_port().is_err());
    }

    #[tokio::test]
    async fn missing_key_fails_at_the_credentials_stage() {
        let mut trace = DialTrace::default();
        let err = dial_traced(&target("127.0.0.1:1"), &mut trace)
            .await
            .unwrap_err();
        assert_eq!(err.stage(), Some(DialStage::Credentials));
        assert_eq!(trace.stages.len(), 1);
        assert!(trace.stages[0].error.is_some());
    }
}
