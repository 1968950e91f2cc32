// Package plotstyle is the look Spillway's SVG charts share: the
// `spillway size --chart` chart and the demo report's charts. It sets the
// font the text is measured with, and writes SVG that falls back to a
// sans-serif of about the same width where that font is missing.
package plotstyle
