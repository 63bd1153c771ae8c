//! Merge layers of functional graphs: [`Add`], [`Multiply`] and [`Concatenate`], each taking
//! two or more inputs, as Keras' layers of the same names.

use lockstep_tensor::{Tensor, ops};

use super::{BuiltinLayerConfig, ForwardContext, Layer, LayerConfig};
use crate::error::{InLayer, NnError};
use crate::params::ParamBuilder;

/// The error of a merge layer given fewer than two inputs.
fn too_few(name: &str, kind: &str, count: usize) -> NnError {
    NnError::InvalidConfig {
        layer: name.to_owned(),
        why: format!("{kind} merges two or more inputs, not {count}"),
    }
}

/// The shared shape of inputs that must all have one shape.
fn same_shapes(name: &str, kind: &str, shapes: &[Vec<usize>]) -> Result<Vec<usize>, NnError> {
    let [first, rest @ ..] = shapes else {
        return Err(too_few(name, kind, 0));
    };
    if rest.is_empty() {
        return Err(too_few(name, kind, 1));
    }
    if let Some(other) = rest.iter().find(|s| *s != first) {
        return Err(NnError::Shape {
            what: format!("layer {name} ({kind}) input"),
            expected: format!("{first:?}, the shape of its first input"),
            got: other.clone(),
        });
    }
    Ok(first.clone())
}

/// Element-wise sum of inputs of one shape: Keras' `Add`, the merge of a residual block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Add;

/// Element-wise product of inputs of one shape: Keras' `Multiply`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Multiply;

/// The two element-wise merges, which differ only in their operation.
macro_rules! elementwise_merge {
    ($layer:ident, $kind:literal, $stem:literal, $op:path) => {
        impl Layer for $layer {
            fn kind(&self) -> &'static str {
                $kind
            }

            fn stem(&self) -> &'static str {
                $stem
            }

            fn config(&self) -> LayerConfig {
                BuiltinLayerConfig::$layer.into()
            }

            fn build(
                &mut self,
                name: &str,
                _input_shape: &[usize],
                _params: &mut ParamBuilder,
            ) -> Result<Vec<usize>, NnError> {
                Err(too_few(name, $kind, 1))
            }

            fn forward(
                &self,
                name: &str,
                _x: &Tensor,
                _params: &[Tensor],
                _ctx: ForwardContext<'_>,
            ) -> Result<Tensor, NnError> {
                Err(too_few(name, $kind, 1))
            }

            fn build_inputs(
                &mut self,
                name: &str,
                input_shapes: &[Vec<usize>],
                _params: &mut ParamBuilder,
            ) -> Result<Vec<usize>, NnError> {
                same_shapes(name, $kind, input_shapes)
            }

            fn forward_inputs(
                &self,
                name: &str,
                xs: &[Tensor],
                _params: &[Tensor],
                _ctx: ForwardContext<'_>,
            ) -> Result<Tensor, NnError> {
                let [first, rest @ ..] = xs else {
                    return Err(too_few(name, $kind, 0));
                };
                if rest.is_empty() {
                    return Err(too_few(name, $kind, 1));
                }
                // Left to right, as Keras adds its inputs.
                rest.iter()
                    .try_fold(first.clone(), |acc, x| $op(&acc, x).in_layer(name))
            }
        }
    };
}

elementwise_merge!(Add, "Add", "add", ops::add);
elementwise_merge!(Multiply, "Multiply", "multiply", ops::mul);

/// Inputs joined along their last axis (Keras' default `axis=-1`), every other axis equal:
/// Keras' `Concatenate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Concatenate;

impl Layer for Concatenate {
    fn kind(&self) -> &'static str {
        "Concatenate"
    }

    fn stem(&self) -> &'static str {
        "concatenate"
    }

    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Concatenate.into()
    }

    fn build(
        &mut self,
        name: &str,
        _input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        Err(too_few(name, "Concatenate", 1))
    }

    fn forward(
        &self,
        name: &str,
        _x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        Err(too_few(name, "Concatenate", 1))
    }

    fn build_inputs(
        &mut self,
        name: &str,
        input_shapes: &[Vec<usize>],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let [first, rest @ ..] = input_shapes else {
            return Err(too_few(name, "Concatenate", 0));
        };
        if rest.is_empty() {
            return Err(too_few(name, "Concatenate", 1));
        }
        let Some((_, leading)) = first.split_last() else {
            return Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: "Concatenate needs inputs with at least one axis".to_owned(),
            });
        };
        let mut joined = 0_usize;
        for shape in input_shapes {
            match shape.split_last() {
                Some((&last, lead)) if lead == leading => joined += last,
                _ => {
                    return Err(NnError::Shape {
                        what: format!("layer {name} (Concatenate) input"),
                        expected: format!("{leading:?} before the joined last axis"),
                        got: shape.clone(),
                    });
                }
            }
        }
        Ok(leading.iter().copied().chain([joined]).collect())
    }

    fn forward_inputs(
        &self,
        name: &str,
        xs: &[Tensor],
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        if xs.len() < 2 {
            return Err(too_few(name, "Concatenate", xs.len()));
        }
        let axis = xs[0].rank().saturating_sub(1);
        let refs: Vec<&Tensor> = xs.iter().collect();
        ops::concat(&refs, axis).in_layer(name)
    }
}
