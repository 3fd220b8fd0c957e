//! Collectives on [`MlxArray`] over a [`Group`]: lazy operations, like every other, that run when
//! the result is evaluated. Every rank of the group must build the same collectives in the same
//! order, on arrays of the same shape and dtype.

use mlx_sys as sys;

use crate::array::MlxArray;
use crate::device::{DeviceType, Stream};
use crate::error::{ErrorContext, Result};

use super::backend::CollectiveBackend;
use super::group::Group;

/// The stream a collective over `backend` runs on: the CPU for the ring and MPI (MLX computes
/// them there), else the current stream if it is a GPU's, else the GPU's default. mlx-c always
/// passes a stream, so MLX's own choice (its `communication_stream` for a caller that names
/// none) is made here.
fn stream_for(backend: CollectiveBackend) -> Result<Stream> {
    if backend.runs_on_cpu() {
        return Stream::cpu();
    }
    let current = Stream::current()?;
    if current.device_type() == DeviceType::Gpu {
        Ok(current)
    } else {
        Stream::gpu()
    }
}

type Collective = unsafe extern "C" fn(
    *mut sys::mlx_array,
    sys::mlx_array,
    sys::mlx_distributed_group,
    sys::mlx_stream,
) -> std::ffi::c_int;

impl MlxArray {
    /// The elementwise sum of this array over every rank of `group` (same shape and dtype on
    /// each). The ring sums in the array's dtype on the CPU, NCCL on the GPU; for a group of one
    /// it is the array itself.
    pub fn all_sum(&self, group: &Group) -> Result<MlxArray> {
        self.collective(group, "all_sum", sys::mlx_distributed_all_sum)
    }

    /// The elementwise maximum over every rank of `group`.
    pub fn all_max(&self, group: &Group) -> Result<MlxArray> {
        self.collective(group, "all_max", sys::mlx_distributed_all_max)
    }

    /// The elementwise minimum over every rank of `group`.
    pub fn all_min(&self, group: &Group) -> Result<MlxArray> {
        self.collective(group, "all_min", sys::mlx_distributed_all_min)
    }

    /// Every rank's array, concatenated along the first axis in rank order (`[size * d0, ...]`;
    /// a 0-d array gives `[size]`).
    pub fn all_gather(&self, group: &Group) -> Result<MlxArray> {
        self.collective(group, "all_gather", sys::mlx_distributed_all_gather)
    }

    fn collective(&self, group: &Group, what: &str, f: Collective) -> Result<MlxArray> {
        let Some((raw, backend)) = group.raw() else {
            return Ok(self.clone());
        };
        let stream = stream_for(backend)?;
        let _scope = stream.enter();
        // SAFETY: the array, group and stream handles are live for the duration of the call;
        // MLX keeps its own references to the group and the input in the result.
        MlxArray::op(|res, s| unsafe { f(res, self.as_raw(), raw, s) })
            .with_context(|| format!("{what} of a {} {:?} array over {group:?}", self.dtype(), self.shape()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_of_a_process_alone_are_the_input() {
        let g = Group::alone();
        let a = MlxArray::from_slice(&[1.0f32, -2.0, 3.5], &[3]).unwrap();
        for r in [a.all_sum(&g), a.all_max(&g), a.all_min(&g), a.all_gather(&g)] {
            assert_eq!(r.unwrap().to_vec::<f32>().unwrap(), [1.0, -2.0, 3.5]);
        }
    }
}
