//! drill-algo
