//! The module's nginx-free logic, unit-tested without nginx: the library itself needs nginx's
//! symbols at load time (`test = false`), so each nginx-free file is compiled here on its own,
//! with the `tests` module it carries.
#![allow(dead_code)]

#[path = "../src/conf.rs"]
mod conf;

#[path = "../src/metrics_text.rs"]
mod metrics_text;

#[path = "../src/attributes.rs"]
mod attributes;

#[path = "../src/zone_props.rs"]
mod zone_props;

#[path = "../src/header_names.rs"]
mod header_names;

#[path = "../src/decimal.rs"]
mod decimal;

#[path = "../src/request/spare_bounds.rs"]
mod spare_bounds;

#[path = "../src/request/in_flight.rs"]
mod in_flight;

// Raw pointers into nginx's list: the one file here with `unsafe` (as in the module).
#[allow(unsafe_code)]
#[path = "../src/table_elts.rs"]
mod table_elts;
