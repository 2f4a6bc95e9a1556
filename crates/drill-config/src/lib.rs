//! drill-config
