//! Neural-network operations of MLX that model code needs beyond the array operations.

mod hadamard;

pub use hadamard::hadamard_transform;
