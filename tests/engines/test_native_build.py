"""native_build's architecture choice: `native` only where CMake understands it (>= 3.24); older CMake (Ubuntu
22.04, JetPack 6: 3.22) gets the device's compute capability instead."""

from __future__ import annotations

from coverpruner.engines import native_build


def test_native_needs_cmake_3_24(monkeypatch):
    monkeypatch.setattr(native_build, "cmake_version", lambda: (3, 22, 1))
    assert native_build.native_architecture("8.7") == "87"
    assert native_build.native_architecture(None) is None
    monkeypatch.setattr(native_build, "cmake_version", lambda: (3, 24, 0))
    assert native_build.native_architecture("8.7") == "native"
    monkeypatch.setattr(native_build, "cmake_version", lambda: None)
    assert native_build.native_architecture("12.0") == "120"
