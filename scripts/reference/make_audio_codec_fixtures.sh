#!/usr/bin/env bash
# Writes the compressed-audio fixtures of crates/audio/tests/codecs.rs into tests/fixtures/audio/.
#
#   scripts/reference/make_audio_codec_fixtures.sh
#
# Needs ffmpeg (made with Debian 12's ffmpeg 7:5.1.9-0+deb12u1: `apt-get install -y ffmpeg`);
# ffmpeg is only a fixture maker and a reference decoder, never a dependency of the crate.
# Inputs are the WAV fixtures of make_mel_goldens.py. Outputs:
#
#   chirp16k.flac            chirp16k.wav, FLAC (lossless: decodes to the WAV's samples)
#   chirp16k.mp3             chirp16k.wav, MP3 (LAME, CBR 64 kbit/s, mono, with the Xing/LAME
#                            header that records the encoder delay and padding)
#   chirp16k.ogg             chirp16k.wav, Ogg Vorbis (libvorbis, quality 3; pages of 0.1 s, so
#                            that a cut or damaged page loses little)
#   chirp16k.mp3.f32         ffmpeg's own decode of chirp16k.mp3, little-endian f32 mono
#   chirp16k.ogg.f32         ffmpeg's own decode of chirp16k.ogg, little-endian f32 mono
#   stereo44k_24bit_0.1s.flac  the first 4410 frames (0.1 s) of stereo44k_24bit.wav, FLAC 24-bit
#                            stereo (lossless: its channel average is read_wav's of those frames)
#
# -bitexact keeps ffmpeg's version out of the files (and makes the Ogg serial number fixed), so
# re-running with the same ffmpeg rewrites identical files.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir="$here/../../tests/fixtures/audio"
cd "$dir"

ff() { ffmpeg -hide_banner -loglevel error -nostdin -y "$@"; }
common=(-map_metadata -1 -fflags +bitexact -flags:a +bitexact)

ff -i chirp16k.wav "${common[@]}" -c:a flac -compression_level 8 chirp16k.flac
ff -i chirp16k.wav "${common[@]}" -c:a libmp3lame -b:a 64k -ac 1 chirp16k.mp3
ff -i chirp16k.wav "${common[@]}" -c:a libvorbis -q:a 3 -ac 1 -page_duration 100000 chirp16k.ogg
ff -i stereo44k_24bit.wav -af atrim=end_sample=4410 "${common[@]}" -c:a flac -compression_level 8 \
    -sample_fmt s32 -bits_per_raw_sample 24 stereo44k_24bit_0.1s.flac

# ffmpeg's decodes (its native mp3float and vorbis decoders), as stored f32: no resampling, no
# dithering (-ac 1 on a mono stream is a no-op).
ff -i chirp16k.mp3 -f f32le -ac 1 chirp16k.mp3.f32
ff -i chirp16k.ogg -f f32le -ac 1 chirp16k.ogg.f32

ls -l chirp16k.flac chirp16k.mp3 chirp16k.ogg chirp16k.mp3.f32 chirp16k.ogg.f32 stereo44k_24bit_0.1s.flac
