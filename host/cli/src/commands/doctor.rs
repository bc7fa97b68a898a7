//! `doctor libvirt`: a hypervisor dialled stage by stage, each stage printed with its time.

use crate::cli::DoctorLibvirtArgs;
use std::process::ExitCode;

/// Runs `doctor libvirt`: exit code 1 when a stage failed.
pub async fn libvirt(a: DoctorLibvirtArgs) -> ExitCode {
    if a.insecure_ignore_host_key {
        eprintln!("warning: host key checking is off; anyone on the path can impersonate the host");
    }
    let report = libvirt_rpc::doctor(libvirt_rpc::DoctorOptions {
        address: a.address,
        user: a.user,
        key_file: a.key,
        known_hosts: a.known_hosts,
        socket_path: a.socket,
        pool: a.pool,
        timeout: None,
    })
    .await;
    let text = report.to_string();
    println!("{}", text.trim_end());
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
