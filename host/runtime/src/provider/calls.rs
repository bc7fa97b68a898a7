//! The typed calls of a provider: create, get, delete and check, each a `provider.<call>`
//! span around one call of the module, its answer converted from the bindings' types.

use crate::bindings as b;
use crate::call::{Op, OpOut};
use crate::provider::{Provider, TARGET, failed_in};
use crate::redact::Redactor;
use egress_core::{
    CreateRequest, ErrorClass, Instance, InstanceState, Placement, ProviderError, TargetStatus,
};
use std::collections::BTreeMap;

impl Provider {
    pub async fn create(
        &self,
        subject: &str,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let started = std::time::Instant::now();
        let r = self.create_inner(subject, req).await;
        self.observed("create", started, r)
    }

    async fn create_inner(
        &self,
        subject: &str,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let redactor = Redactor::for_create(req.cloud_init.as_deref(), req.htpasswd.as_deref());
        // The instance name and zone find the instance in the backend; the request's
        // cloud-init never becomes an attribute.
        let span = tracing::info_span!(
            target: TARGET,
            "provider.create",
            provider = %self.name,
            subject,
            instance = %req.name,
            zone = req.placement.zone.as_deref(),
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = Op::Create(
            self.ctx(),
            Box::new(to_wit_request(req)),
            req.htpasswd.clone(),
        );
        let out = self
            .call(op, span.clone(), subject, redactor.clone())
            .await
            .and_then(|o| match o {
                OpOut::Create(r) => r
                    .map(from_wit_instance)
                    .map_err(|e| self.guest_error("create", e, &redactor)),
                _ => Err(self.wrong_shape("create")),
            });
        failed_in(&span, out)
    }

    pub async fn get(&self, subject: &str, provider_id: &str) -> Result<Instance, ProviderError> {
        let started = std::time::Instant::now();
        let r = self.get_inner(subject, provider_id).await;
        self.observed("get", started, r)
    }

    async fn get_inner(&self, subject: &str, provider_id: &str) -> Result<Instance, ProviderError> {
        let r = Redactor::default();
        let span = tracing::info_span!(
            target: TARGET,
            "provider.get",
            provider = %self.name,
            subject,
            provider_id,
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = Op::Get(self.ctx(), provider_id.into());
        let out = self
            .call(op, span.clone(), subject, r.clone())
            .await
            .and_then(|o| match o {
                OpOut::Get(r2) => r2
                    .map(from_wit_instance)
                    .map_err(|e| self.guest_error("get", e, &r)),
                _ => Err(self.wrong_shape("get")),
            });
        failed_in(&span, out)
    }

    pub async fn delete(&self, subject: &str, provider_id: &str) -> Result<(), ProviderError> {
        let started = std::time::Instant::now();
        let r = self.delete_inner(subject, provider_id).await;
        self.observed("delete", started, r)
    }

    async fn delete_inner(&self, subject: &str, provider_id: &str) -> Result<(), ProviderError> {
        let r = Redactor::default();
        let span = tracing::info_span!(
            target: TARGET,
            "provider.delete",
            provider = %self.name,
            subject,
            provider_id,
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = Op::Delete(self.ctx(), provider_id.into());
        let out = self
            .call(op, span.clone(), subject, r.clone())
            .await
            .and_then(|o| match o {
                OpOut::Delete(r2) => r2.map_err(|e| self.guest_error("delete", e, &r)),
                _ => Err(self.wrong_shape("delete")),
            });
        failed_in(&span, out)
    }

    /// The health of each backend target. A failed call is one target with the failure.
    pub async fn check(&self) -> Vec<TargetStatus> {
        let started = std::time::Instant::now();
        let out = self.check_inner().await;
        let failed = out.iter().any(|t| t.reason != "Healthy");
        if let Some(o) = self.runtime.inner.observer.get() {
            o.observe(
                &self.name,
                "check",
                started.elapsed(),
                failed.then_some(ErrorClass::Transient),
            );
        }
        out
    }

    async fn check_inner(&self) -> Vec<TargetStatus> {
        let span = tracing::info_span!(target: TARGET, "provider.check", provider = %self.name);
        match self
            .call(Op::Check(self.ctx()), span, "check", Redactor::default())
            .await
        {
            Ok(OpOut::Check(targets)) => targets
                .into_iter()
                .map(|t| TargetStatus {
                    target: t.target,
                    address: t.address,
                    reason: t.reason,
                    message: t.message,
                    details: t.details.into_iter().collect(),
                })
                .collect(),
            Ok(_) => vec![],
            Err(e) => vec![TargetStatus {
                target: "module".into(),
                address: String::new(),
                reason: e.reason.clone(),
                message: e.message,
                details: BTreeMap::new(),
            }],
        }
    }
}

fn to_wit_request(r: &CreateRequest) -> b::CreateRequest {
    let Placement {
        zone,
        region,
        machine_type,
        image,
    } = r.placement.clone();
    b::CreateRequest {
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        uid: r.uid.clone(),
        port: r.port,
        placement: b::Placement {
            zone,
            region,
            machine_type,
            image,
        },
        cloud_init: r.cloud_init.clone(),
        installation: r.installation.clone(),
        owner: r.owner.as_ref().map(|o| b::OwnerReference {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        }),
    }
}

pub(super) fn from_wit_instance(i: b::Instance) -> Instance {
    Instance {
        provider_id: i.provider_id,
        name: i.name,
        uid: i.uid,
        installation: i.installation,
        state: match i.state {
            b::InstanceState::Provisioning => InstanceState::Provisioning,
            b::InstanceState::Running => InstanceState::Running,
            b::InstanceState::Stopped => InstanceState::Stopped,
            b::InstanceState::Terminated => InstanceState::Terminated,
        },
        ip: i.ip,
        created_at: i.created_at,
    }
}
