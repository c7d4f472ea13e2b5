//! Programmatic dependent launch (crates/kernels-cuda/src/launch.rs): a long chain of dependent
//! small kernels gives exactly the host's values with PDL on and off, eagerly and replayed from
//! a captured graph; every kernel begins with `PDL_WAIT()`, which compiles to
//! `griddepcontrol.wait` on sm_90 and to nothing below. The GPU test skips without a GPU, the
//! PTX test without libnvrtc.

use synaptix_kernels_cuda::{cuda_status, ops, probe, sources, CudaDevice, CudaStatus};

/// Scale factors of the chain, cycled (their product is below 1, so values stay bounded).
const SCALES: [f32; 4] = [0.5, 1.25, 0.875, 1.0625];
/// `scale` + `add` pairs: 200 kernels, each reading what the previous one wrote.
const PAIRS: usize = 100;

fn host_chain(x: &[f32], c: &[f32]) -> Vec<f32> {
    let mut x = x.to_vec();
    for i in 0..PAIRS {
        let s = SCALES[i % SCALES.len()];
        for (v, c) in x.iter_mut().zip(c) {
            *v *= s;
            *v += *c;
        }
    }
    x
}

fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Multiples of 2^-23 in [-1, 1).
        ((state >> 40) as i32 - (1 << 23)) as f32 / (1 << 23) as f32
    };
    let x = (0..n).map(|_| next()).collect();
    let c = (0..n).map(|_| next()).collect();
    (x, c)
}

#[test]
fn dependent_chain_is_exact_with_and_without_pdl() {
    if let CudaStatus::Unavailable(why) = cuda_status() {
        eprintln!("SKIPPED: no usable GPU ({why})");
        return;
    }
    let dev = CudaDevice::new(0).expect("device 0");
    // Several blocks, the last one partial.
    let n = 100_003;
    let (x0, c0) = inputs(n);
    let want = host_chain(&x0, &c0);
    let c = dev.upload(&c0).unwrap();
    let run = |x: &mut synaptix_kernels_cuda::DeviceBuffer<f32>,
               y: &mut synaptix_kernels_cuda::DeviceBuffer<f32>| {
        for i in 0..PAIRS {
            ops::scale(&dev, x, SCALES[i % SCALES.len()]).unwrap();
            ops::add(&dev, y, x, &c).unwrap();
            std::mem::swap(x, y);
        }
    };
    let supported = dev.set_pdl(true);
    eprintln!(
        "{} (compute capability {:?}): PDL {}",
        dev.info.name,
        dev.info.compute_capability,
        if supported {
            "on"
        } else {
            "unsupported, plain launches"
        }
    );
    for pdl in [true, false] {
        dev.set_pdl(pdl);
        let mut x = dev.upload(&x0).unwrap();
        let mut y = dev.zeros::<f32>(n).unwrap();
        run(&mut x, &mut y);
        let got = dev.download(&x).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "eager chain differs from the host (PDL requested: {pdl})"
        );

        // The same chain recorded into a graph, replayed twice from a fresh input.
        dev.begin_capture().unwrap();
        run(&mut x, &mut y);
        let mut graph = dev
            .end_capture()
            .unwrap()
            .expect("the capture recorded kernels");
        for replay in 0..2 {
            dev.overwrite(&x, &x0).unwrap();
            graph.launch().unwrap();
            let got = dev.download(&x).unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "graph replay {replay} differs from the host (PDL requested: {pdl})"
            );
        }
    }
}

/// Every kernel of the embedded sources (gemm_k excepted: launched through cudarc by its own
/// module) starts with `PDL_WAIT();`, which launches through crate::launch rely on, or with
/// `PDL_WAITS_INSIDE();` (the matvecs and the one-pass decode attention: loads of what no kernel
/// of the step writes start first, then the wait).
#[test]
fn every_kernel_begins_with_pdl_wait() {
    let mut kernels = 0;
    for file in sources::FILES.iter().filter(|f| f.name != "gemm_k") {
        let src = file.source;
        let mut from = 0;
        while let Some(at) = src[from..].find("extern \"C\" __global__") {
            let start = from + at;
            let open = start + src[start..].find('{').expect("kernel body");
            let body = src[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
            let name: String = src[start..open].split('(').next().unwrap_or("").into();
            // PDL_WAITS_INSIDE(): read-only loads first, then the wait (common.cuh).
            assert!(
                body.starts_with("PDL_WAIT();") || body.starts_with("PDL_WAITS_INSIDE();"),
                "{}: kernel `{}` does not begin with PDL_WAIT() or PDL_WAITS_INSIDE()",
                file.name,
                name.split_whitespace().last().unwrap_or("?")
            );
            kernels += 1;
            from = open;
        }
    }
    assert!(kernels >= 38, "found only {kernels} kernels");
}

/// `PDL_WAIT()` / `PDL_TRIGGER()` emit the griddepcontrol instructions for sm_90 and nothing
/// for sm_80 (where they do not exist).
#[test]
fn griddepcontrol_only_from_sm_90() {
    if !probe::nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found");
        return;
    }
    let file = sources::find("elementwise").unwrap();
    let src = sources::full_source(file);
    for (arch, expected) in [("compute_80", false), ("compute_90", true)] {
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(
            &src,
            cudarc::nvrtc::CompileOptions {
                arch: Some(arch),
                options: vec!["--std=c++17".into(), "-default-device".into()],
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{arch}: {e:?}"))
        .to_src();
        assert_eq!(
            ptx.contains("griddepcontrol.wait"),
            expected,
            "{arch}: griddepcontrol.wait"
        );
        assert_eq!(
            ptx.contains("griddepcontrol.launch_dependents"),
            expected,
            "{arch}: griddepcontrol.launch_dependents"
        );
    }
}
