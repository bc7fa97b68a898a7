#![doc = include_str!("../README.md")]

pub mod faults;
pub mod gce;
pub mod kube;
pub mod libvirt;
pub mod xml;
