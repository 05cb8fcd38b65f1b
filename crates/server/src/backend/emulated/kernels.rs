//! Placeholder until the reference kernels land.
use crate::backend::ParamSlot;
use gpuplex_protocol::CuError;
pub struct KernelLaunch<'a> {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub params: &'a [u8],
    pub layout: &'a [ParamSlot],
}
pub trait DeviceMemory {
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CuError>;
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), CuError>;
}
pub type ReferenceKernel = fn(&KernelLaunch<'_>, &mut dyn DeviceMemory) -> Result<(), CuError>;
pub fn lookup(_name: &str) -> Option<ReferenceKernel> {
    None
}
