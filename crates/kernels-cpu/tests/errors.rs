//! Wrong shapes and unsupported types are typed errors, never panics.

use synaptix_core::{DType, Error};
use synaptix_kernels_cpu::{
    activation_dtype, dequantize, matmul, matmul_quantized, quantize_acts, vec_dot, WeightView,
};

fn is_shape(r: Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::ShapeMismatch { .. }))
}

fn is_unsupported(r: Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::UnsupportedDType { .. }))
}

#[test]
fn dequantize_errors() {
    let mut out = vec![0f32; 32];
    assert!(is_shape(dequantize(DType::Q4_0, &[0; 17], &mut out)));
    assert!(is_shape(dequantize(DType::Q4_0, &[0; 19], &mut out)));
    assert!(is_shape(dequantize(DType::Q4_0, &[0; 18], &mut out[..31])));
    assert!(is_shape(dequantize(DType::Q4K, &[0; 144], &mut out)));
    assert!(is_shape(dequantize(DType::F32, &[0; 4], &mut out)));
    assert!(is_unsupported(dequantize(
        DType::IQ2XXS,
        &[0; 66],
        &mut [0f32; 256]
    )));
    assert!(is_unsupported(dequantize(DType::I8, &[0; 32], &mut out)));
    assert!(dequantize(DType::Q4_0, &[0; 18], &mut out).is_ok());
    assert!(dequantize(DType::F16, &[], &mut []).is_ok());
}

#[test]
fn quantize_acts_errors() {
    assert!(is_shape(quantize_acts(DType::Q8_0, &[0.0; 33])));
    assert!(is_shape(quantize_acts(DType::Q4K, &[0.0; 128])));
    assert!(is_unsupported(quantize_acts(DType::IQ2XXS, &[0.0; 256])));
    assert!(is_unsupported(activation_dtype(DType::Q8K)));
    assert!(quantize_acts(DType::F16, &[0.0; 3]).is_ok());
}

#[test]
fn vec_dot_errors() {
    let acts = quantize_acts(DType::Q8_0, &[1.0; 64]).unwrap();
    assert!(vec_dot(DType::Q8_0, &[0; 68], &acts).is_ok());
    assert!(is_shape(vec_dot(DType::Q8_0, &[0; 67], &acts)));
    assert!(is_shape(vec_dot(DType::Q4_0, &[0; 18], &acts)));
    // Activations quantized for another weight type.
    assert!(matches!(
        vec_dot(DType::Q4_1, &[0; 40], &acts),
        Err(Error::Invalid { .. })
    ));
    assert!(is_unsupported(vec_dot(DType::IQ2XXS, &[0; 66], &acts)));
}

#[test]
fn matmul_errors() {
    let w = vec![0u8; 2 * 34];
    let x = vec![1.0f32; 2 * 32];
    let mut y = vec![0f32; 4];
    let view = |data: &'static [u8], dtype, rows, cols| WeightView {
        dtype,
        data,
        rows,
        cols,
    };
    let ok = WeightView {
        dtype: DType::Q8_0,
        data: &w,
        rows: 2,
        cols: 32,
    };
    assert!(matmul(ok, &x, 2, &mut y).is_ok());
    assert!(is_shape(matmul(ok, &x[1..], 2, &mut y)));
    assert!(is_shape(matmul(ok, &x, 2, &mut y[1..])));
    assert!(is_shape(matmul(ok, &x, 3, &mut y)));
    let short = WeightView {
        data: &w[1..],
        ..ok
    };
    assert!(is_shape(matmul(short, &x, 2, &mut y)));
    assert!(is_shape(matmul(
        view(&[0; 68], DType::Q8_0, 2, 33),
        &[0.0; 66],
        1,
        &mut y[..2]
    )));
    assert!(is_shape(matmul(
        view(&[0; 68], DType::Q8_0, usize::MAX, 32),
        &[0.0; 32],
        1,
        &mut y[..2]
    )));
    assert!(is_unsupported(matmul(
        view(&[0; 132], DType::IQ2XXS, 2, 256),
        &[0.0; 256],
        1,
        &mut y[..2]
    )));
}

#[test]
fn matmul_quantized_errors() {
    let w = vec![0u8; 2 * 34];
    let view = WeightView {
        dtype: DType::Q8_0,
        data: &w,
        rows: 2,
        cols: 32,
    };
    let q8 = quantize_acts(DType::Q8_0, &[1.0; 32]).unwrap();
    let q8_1 = quantize_acts(DType::Q4_1, &[1.0; 32]).unwrap();
    let long = quantize_acts(DType::Q8_0, &[1.0; 64]).unwrap();
    let mut y = vec![0f32; 4];
    assert!(matmul_quantized(view, &[q8.clone(), q8.clone()], &mut y).is_ok());
    assert!(is_shape(matmul_quantized(
        view,
        std::slice::from_ref(&q8),
        &mut y
    )));
    assert!(is_shape(matmul_quantized(
        view,
        &[q8.clone(), long],
        &mut y
    )));
    assert!(matches!(
        matmul_quantized(view, &[q8.clone(), q8_1.clone()], &mut y),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        matmul_quantized(view, &[q8_1.clone(), q8_1], &mut y),
        Err(Error::Invalid { .. })
    ));
    assert!(matmul_quantized(view, &[], &mut []).is_ok());
}
