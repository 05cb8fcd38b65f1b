//! Placeholder until the image parser lands.
use crate::backend::ParamSlot;
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub kernels: Vec<KernelInfo>,
    pub globals: Vec<GlobalInfo>,
}
#[derive(Debug, Clone, PartialEq)]
pub struct KernelInfo {
    pub name: String,
    pub params: Vec<ParamSlot>,
    pub param_bytes: u32,
    pub shared_bytes: u32,
    pub registers: u32,
    pub max_threads_per_block: Option<u32>,
}
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalInfo {
    pub name: String,
    pub size: u64,
    pub init: Vec<u8>,
}
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("unsupported")]
    Unsupported,
}
pub fn parse(_image: &[u8]) -> Result<Image, ImageError> {
    Err(ImageError::Unsupported)
}
