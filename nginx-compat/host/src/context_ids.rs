//! Context ids of a [`Vm`](crate::Vm).

/// A root context id in a [`Vm`] (one per plugin that uses the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RootId(pub u32);
/// An HTTP context id in a [`Vm`] (one per stream per plugin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HttpId(pub u32);
