package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	restclient "k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// certManagerInjectAnnotation makes cert-manager's cainjector fill in the
// conversion webhook's CA bundle; meaningless without cert-manager.
const certManagerInjectAnnotation = "cert-manager.io/inject-ca-from"

// readCRDs reads every CustomResourceDefinition from the given (multi-document)
// YAML or JSON files and makes them installable without their operator:
//   - a `spec.conversion` with strategy Webhook is dropped (strategy None is
//     the default), because there is no webhook service to call;
//   - the cert-manager CA-injection annotation is dropped.
//
// Any other kind of object in the files is an error.
func readCRDs(paths []string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := reader.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			jsonDoc, err := yaml.YAMLToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			if len(bytes.TrimSpace(jsonDoc)) == 0 || string(bytes.TrimSpace(jsonDoc)) == "null" {
				continue // empty document, e.g. a leading "---"
			}
			obj := &unstructured.Unstructured{}
			if err := obj.UnmarshalJSON(jsonDoc); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			if gvk := obj.GroupVersionKind(); gvk.Group != crdGVR.Group || gvk.Kind != "CustomResourceDefinition" {
				return nil, fmt.Errorf("%s: %s %q is not a CustomResourceDefinition", path, gvk, obj.GetName())
			}
			if strategy, _, _ := unstructured.NestedString(obj.Object, "spec", "conversion", "strategy"); strategy == "Webhook" {
				unstructured.RemoveNestedField(obj.Object, "spec", "conversion")
			}
			if ann := obj.GetAnnotations(); ann != nil {
				delete(ann, certManagerInjectAnnotation)
				obj.SetAnnotations(ann)
			}
			// Never send server-owned fields.
			unstructured.RemoveNestedField(obj.Object, "status")
			obj.SetResourceVersion("")
			out = append(out, obj)
		}
	}
	return out, nil
}

// installCRDs creates (or replaces) the CRDs from the given files and waits
// until every one is Established, i.e. its resources are served.
//
// It deliberately uses create/update rather than server-side apply: apply
// adds managedFields for every schema field, and the Kamaji
// TenantControlPlane CRD (~729 KB of YAML) would then grow towards etcd's
// 1.5 MiB request limit.
func installCRDs(ctx context.Context, cfg *restclient.Config, paths []string) ([]string, error) {
	crds, err := readCRDs(paths)
	if err != nil {
		return nil, err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	res := client.Resource(crdGVR)
	var names []string
	for _, crd := range crds {
		name := crd.GetName()
		names = append(names, name)
		_, err := res.Create(ctx, crd, metav1.CreateOptions{FieldManager: "kube-harness"})
		if apierrors.IsAlreadyExists(err) {
			// Replace the existing one, keeping its resourceVersion for the update.
			existing, getErr := res.Get(ctx, name, metav1.GetOptions{})
			if getErr != nil {
				return nil, getErr
			}
			crd.SetResourceVersion(existing.GetResourceVersion())
			_, err = res.Update(ctx, crd, metav1.UpdateOptions{FieldManager: "kube-harness"})
		}
		if err != nil {
			return nil, fmt.Errorf("installing CRD %s: %w", name, err)
		}
	}

	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			crd, err := res.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conditions {
				cond, _ := c.(map[string]interface{})
				if cond["type"] == "Established" && cond["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return nil, fmt.Errorf("CRD %s did not become Established: %w", name, err)
		}
	}
	klog.FromContext(ctx).Info("Installed CRDs", "crds", names)
	return names, nil
}
